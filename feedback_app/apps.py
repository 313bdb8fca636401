from django.apps import AppConfig


class FeedbackAppConfig(AppConfig):
    name = "feedback_app"
    verbose_name = "Tandem feedback"
    default_auto_field = "django.db.models.BigAutoField"
