"""The web process's entry point (uvicorn): Django's async handler, so streamed replies
(/v1 ``stream: true``) are relayed on the event loop without a thread per open stream."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# No persistent database connections here, whatever DB_CONN_MAX_AGE says (Django: "when
# using ASGI, persistent connections should be disabled"): a request's sync code runs in
# threads that come and go, each leaving its own connection open until it was collected
# (16 streaming clients held up to 82 of Postgres's 100; a burst beside them was refused).
# Connections come from a pool of the process instead (DB_POOL, unless set to 0: a new one
# per request, config/settings.py), at most DB_POOL_MAX_SIZE of them.
os.environ["DB_CONN_MAX_AGE"] = "0"
os.environ.setdefault("DB_POOL", "1")
application = get_asgi_application()

from django.conf import settings  # noqa: E402  (after setup)

if settings.DEBUG:  # what runserver did for the admin's CSS and JS (make demo)
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)

from tenants.api.streaming import StreamRelay  # noqa: E402

# streamed replies are sent from the event loop once Django's request is done
application = StreamRelay(application)
