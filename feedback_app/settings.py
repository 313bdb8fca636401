"""Tandem's one settings module. Every knob comes from the environment; `.env.example` lists them all.

The defaults are the embedded laptop set-up: SQLite and Celery's filesystem broker inside TANDEM_DATA_DIR.
Importing this module reads the environment and, at most, the generated secret key file: it writes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from feedback_app.env import env_bool, env_int, env_list, env_path, env_path_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("TANDEM_DATA_DIR", BASE_DIR / "var")

# Off unless asked for: with DEBUG on, a 404 lists every URL pattern and a 500 shows a traceback with local variables.
DEBUG = env_bool("DEBUG", False)

# SECRET_KEY from the environment, or else the key file the laptop command generates once and keeps
# (`python -m feedback_app.secret_key`), so sessions survive restarts. Without either, only DEBUG may run, on a
# fixed development key.
SECRET_KEY_FILE = DATA_DIR / "secret_key"
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if SECRET_KEY_FILE.exists():
        SECRET_KEY = SECRET_KEY_FILE.read_text().strip()
    elif DEBUG:
        SECRET_KEY = "insecure-development-key-run-python-m-feedback-app-secret-key"
    else:
        raise ImproperlyConfigured(
            f"SECRET_KEY is required when DEBUG is off: set it, or create {SECRET_KEY_FILE} with "
            "`python -m feedback_app.secret_key`."
        )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "feedback_app",
    "training",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "feedback_app.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "feedback_app.views.errors.DatabaseBusyMiddleware",
]

ROOT_URLCONF = "feedback_app.urls"
WSGI_APPLICATION = "feedback_app.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'tandem.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
    )
}
# The annotators' busiest statements are prepared once per connection on PostgreSQL (feedback_app/hot_path/rows.py).
# Turn it off behind a connection pooler that cannot keep prepared statements (PgBouncer in transaction mode before
# 1.21).
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the worker write to the same file: WAL lets readers go on while one writes, and
    # IMMEDIATE transactions take the write lock up front instead of failing with "database is locked" midway.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not the in-memory default, so a Celery worker process in the end-to-end tests sees the test data.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-tandem.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Django's database sessions and ModelBackend, each reading with one hand-written statement (feedback_app/sessions.py,
# feedback_app/hot_path/sessions.py).
SESSION_ENGINE = "feedback_app.sessions"
AUTHENTICATION_BACKENDS = ["feedback_app.sessions.UserBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic copies the files; only a collected set-up (TANDEM_COLLECTED_STATIC, below) serves from it.
STATIC_ROOT = env_path("STATIC_ROOT", DATA_DIR / "staticfiles") if env_bool("TANDEM_COLLECTED_STATIC", False) else None
MEDIA_URL = "media/"
MEDIA_ROOT = env_path("MEDIA_ROOT", DATA_DIR / "media")
# Model weights, tokenizers, checkpoints and exported datasets. On a team set-up this is a volume shared by the
# web, rollout and training workers.
ARTIFACT_ROOT = env_path("ARTIFACT_ROOT", DATA_DIR / "artifacts")
# Folders of base models every project may load (a policy version's weights, a judge's base model), besides its own
# artifact folders. Comma-separated absolute paths; see feedback_app/models/locations.py.
TANDEM_SHARED_MODEL_ROOTS = [str(path) for path in env_path_list("TANDEM_SHARED_MODEL_ROOTS")]
# Hosts an endpoint policy may call: names, *.domain wildcards, IP addresses or networks, or * for any host whose
# addresses are all public. Empty: no endpoint policies. Loopback, link-local and private addresses need an entry
# that names them.
TANDEM_ENDPOINT_ALLOWLIST = env_list("TANDEM_ENDPOINT_ALLOWLIST", [])
# Static files: the laptop command and the tests serve them through WhiteNoise straight from the apps' folders; an
# image that ran collectstatic at build time (TANDEM_COLLECTED_STATIC) serves the hashed, compressed copies.
TANDEM_COLLECTED_STATIC = env_bool("TANDEM_COLLECTED_STATIC", False)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if TANDEM_COLLECTED_STATIC
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not TANDEM_COLLECTED_STATIC
WHITENOISE_AUTOREFRESH = DEBUG

# Behind HTTPS (a TLS-terminating proxy that sets X-Forwarded-Proto): secure cookies, HSTS and a redirect of plain
# HTTP. Off on the laptop, which serves plain HTTP on localhost.
TANDEM_HTTPS = env_bool("TANDEM_HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", TANDEM_HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", TANDEM_HTTPS)
if TANDEM_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy of every page (feedback_app/security.py): scripts, styles, images and requests only from
# Tandem itself; no inline script.
TANDEM_CSP = env_str(
    "TANDEM_CSP",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'",
)

# --- Celery -------------------------------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_FOLDER = env_path("CELERY_BROKER_FOLDER", DATA_DIR / "broker")
if urlparse(CELERY_BROKER_URL).scheme == "filesystem":
    # Kombu's filesystem transport moves messages through one folder; the web process and every worker must share
    # it, and in must equal out or nothing is ever delivered. `training.broker` takes them in the order they were sent.
    CELERY_BROKER_TRANSPORT = "training.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_FOLDER / "messages"),
        "data_folder_out": str(CELERY_BROKER_FOLDER / "messages"),
        "control_folder": str(CELERY_BROKER_FOLDER / "control"),
        "store_processed": False,
    }
else:
    # Redis: a message a worker took but never acknowledged (the worker was killed) is delivered again after this
    # long. A long run outliving it is delivered twice; `training.runs.execute_run` sees the live owner and waits.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("TANDEM_BROKER_VISIBILITY_SECONDS", 3600, minimum=10),
    }
# Run state lives on TrainingRun rows, not in a result backend.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "training.rollout": {"queue": "rollouts"},
    "training.continue_intervention": {"queue": "rollouts"},
    "training.train_*": {"queue": "training"},
}

# --- Tandem -------------------------------------------------------------------------------------------------------
TANDEM_DEFAULT_LEASE_MINUTES = env_int("TANDEM_DEFAULT_LEASE_MINUTES", 30, minimum=1)
# Loaded policies each worker process keeps in memory.
TANDEM_POLICY_CACHE_SIZE = env_int("TANDEM_POLICY_CACHE_SIZE", 2, minimum=1)
# Device for local policies in rollout workers: "auto" takes CUDA when there is one.
TANDEM_POLICY_DEVICE = env_str("TANDEM_POLICY_DEVICE", "auto")
# Torch threads per worker process; 0 keeps torch's own default.
TANDEM_TORCH_THREADS = env_int("TANDEM_TORCH_THREADS", 0, minimum=0)
# A run whose worker on another host has not reported for this long is presumed dead, and a redelivered message for
# it takes it over (from its last checkpoint). A worker on the same host is checked in the process table instead.
TANDEM_RUN_STALE_SECONDS = env_int("TANDEM_RUN_STALE_SECONDS", 300, minimum=10)

# --- REST framework -----------------------------------------------------------------------------------------------
TANDEM_API_PAGE_SIZE = env_int("TANDEM_API_PAGE_SIZE", 50, minimum=1)
TANDEM_API_MAX_PAGE_SIZE = env_int("TANDEM_API_MAX_PAGE_SIZE", 1000, minimum=1)
# Request rates ("<n>/<second|minute|hour|day>"), counted in Django's cache (per process unless CACHES is shared).
TANDEM_API_THROTTLE_RATES = {
    "anon": env_str("TANDEM_API_THROTTLE_ANON", "300/hour"),
    "user": env_str("TANDEM_API_THROTTLE_USER", "20000/hour"),
    "imports": env_str("TANDEM_API_THROTTLE_IMPORTS", "200/hour"),
}
for _scope, _rate in TANDEM_API_THROTTLE_RATES.items():
    if not re.fullmatch(r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)", _rate):
        raise ImproperlyConfigured(f"TANDEM_API_THROTTLE_{_scope.upper()} must look like 100/hour, got {_rate!r}.")
# The largest import body (trajectories or preferences) the API accepts, in bytes.
TANDEM_IMPORT_MAX_BYTES = env_int("TANDEM_IMPORT_MAX_BYTES", 100 * 1024 * 1024, minimum=1)
# The largest trajectory Tandem stores (imports, the API): steps, and bytes of step text and tool-call arguments. A
# larger one is refused with a 400 naming the limit; its pages would be too large to label.
TANDEM_MAX_TRAJECTORY_STEPS = env_int("TANDEM_MAX_TRAJECTORY_STEPS", 1000, minimum=1)
TANDEM_MAX_TRAJECTORY_BYTES = env_int("TANDEM_MAX_TRAJECTORY_BYTES", 8 * 1024 * 1024, minimum=1024)
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "feedback_app.api.schema.TandemAutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "feedback_app.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Keep ReadOnlyTokenPermission in any view that sets its own permission_classes (feedback_app.api.permissions).
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "feedback_app.api.permissions.ReadOnlyTokenPermission",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "feedback_app.api.parsers.CheckedJSONParser",
        "feedback_app.api.parsers.CheckedFormParser",
        "feedback_app.api.parsers.CheckedMultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "feedback_app.api.pagination.ApiCursorPagination",
    "DEFAULT_FILTER_BACKENDS": ["feedback_app.api.filtering.TandemFilterBackend"],
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": TANDEM_API_THROTTLE_RATES,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tandem API",
    "DESCRIPTION": "Human feedback and RLHF for agent policies.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No validator badge: Swagger UI would fetch it from validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # Several models have a `status` or `source` with different choices: name each enum after its model.
    "ENUM_NAME_OVERRIDES": {
        "AssignmentStatusEnum": "feedback_app.models.queue.AssignmentStatus",
        "LabelKindEnum": "feedback_app.models.labels.LabelKind",
        "RunStatusEnum": "feedback_app.models.runs.RunStatus",
        "InterventionStatusEnum": "feedback_app.models.labels.InterventionStatus",
        "TrajectorySourceEnum": "feedback_app.models.trajectories.TrajectorySource",
        "ImportedSourceEnum": ["import", "human"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
