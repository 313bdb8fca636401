from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from feedback_app.api import imports, labels, projects, queue, runs, trajectories
from feedback_app.security import csp_allowing

router = SimpleRouter(use_regex_path=False)
router.register("projects", projects.ProjectViewSet, basename="api-project")
in_project = "projects/<int:project_pk>/"
router.register(in_project + "tasks", projects.TaskViewSet, basename="api-task")
router.register(in_project + "policy-versions", projects.PolicyVersionViewSet, basename="api-policy-version")
router.register(in_project + "trajectories", trajectories.TrajectoryViewSet, basename="api-trajectory")
router.register(in_project + "comparisons", labels.ComparisonViewSet, basename="api-comparison")
router.register(in_project + "step-labels", labels.StepLabelViewSet, basename="api-step-label")
router.register(in_project + "critiques", labels.CritiqueViewSet, basename="api-critique")
router.register(in_project + "ratings", labels.RatingViewSet, basename="api-rating")
router.register(in_project + "interventions", labels.InterventionViewSet, basename="api-intervention")
router.register(in_project + "assignments", runs.AssignmentViewSet, basename="api-assignment")
# assignments/next/, assignments/<pk>/skip/ and assignments/<pk>/finish/: the queue, as the annotator pages use it.
router.register(in_project + "assignments", queue.QueueViewSet, basename="api-queue")
router.register(in_project + "runs", runs.TrainingRunViewSet, basename="api-run")
router.register(in_project + "evaluations", runs.EvaluationViewSet, basename="api-evaluation")
router.register(in_project + "models", runs.RegisteredModelViewSet, basename="api-registered-model")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path(
        "redoc/",
        # ReDoc's search runs in a worker it starts from a blob.
        csp_allowing("worker-src 'self' blob:")(
            SpectacularRedocView.as_view(url_name="api-schema", template_name="feedback_app/api_redoc.html")
        ),
        name="api-redoc",
    ),
    # Imports take the project id in the path and the rows as a streamed body (JSON array or JSON Lines).
    path(
        "projects/<int:project_pk>/trajectories/import",
        imports.TrajectoryImportView.as_view(),
        name="api-trajectory-import",
    ),
    path(
        "projects/<int:project_pk>/preferences/import",
        imports.PreferenceImportView.as_view(),
        name="api-preference-import",
    ),
    path("", include(router.urls)),
    path("", include("feedback_app.api.export_urls")),
]
