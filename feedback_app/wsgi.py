"""The WSGI application that gunicorn serves.

Once Django, the URL configuration and every view are loaded, the objects that exist then are moved out of the
garbage collector's reach (`gc.freeze`). They live as long as the worker anyway, and there are about 100,000 of them:
without the freeze, each full collection walks them all and holds every thread of the worker for tens of
milliseconds under load, a wait added to whichever requests the worker is serving then; a long export, which makes
objects without pause, triggers many such collections and spent about a fifth of its CPU in them. After the freeze,
a full collection walks only what requests have left behind.
"""

import gc
import importlib
import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "feedback_app.settings")
application = get_wsgi_application()
importlib.import_module(settings.ROOT_URLCONF)  # every view is imported now rather than on the first request
gc.collect()
gc.freeze()
