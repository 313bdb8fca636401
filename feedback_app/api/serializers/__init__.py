"""Serializers of the REST API's resources, one module per resource family, beside the views that use them (`projects`,
`trajectories`, `runs`, `labels`). The import row schemas live in feedback_app/trajectory_schema.py.

Fields that reveal outcomes (success, returns, rewards, oracle facts) and, in blind projects, which policy made a
trajectory are dropped for annotators by HiddenFieldsMixin; the schema documents them as "researchers and admins
only".
"""
