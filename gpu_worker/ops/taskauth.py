"""The worker's half of authenticated task messages (the signing is ``config.taskauth``).

:class:`SignedTask` (the base of every GPU task) checks a message's signature before the
task body runs: a forged message (no or a wrong signature) or an altered one (arguments,
task name or id changed after signing) is rejected unrun and not requeued, counted in
``kvi_worker_task_messages_refused_total`` and logged by task name and id only, never its
arguments. A direct call in-process (``task(...)``, tests) is not a message and runs.
"""

from __future__ import annotations

import logging

from celery.exceptions import Reject

from config import taskauth
from gpu_worker.ops import metrics
from gpu_worker.ops.logpolicy import PrivateArgsTask

log = logging.getLogger(__name__)


class SignedTask(PrivateArgsTask):
    def __call__(self, *args, **kwargs):
        request = self.request
        if not request.called_directly:
            sig = getattr(request, taskauth.HEADER, None)
            if not taskauth.is_authentic(self.name, request.id, args, kwargs, sig):
                metrics.TASKS_REFUSED.labels(self.name).inc()
                log.warning("refused task %s[%s]: its message is %s; nothing was run",
                            self.name, request.id, "unsigned" if sig is None else
                            "not signed by this platform or altered after signing")
                raise Reject("unauthenticated task message", requeue=False)
        return super().__call__(*args, **kwargs)
