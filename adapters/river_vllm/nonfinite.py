"""No silent wrong answer inside vLLM: a request whose logits went NaN ends as a request
error (vLLM's FinishReason.ERROR: the server answers it with a 500, or the offline engine's
output says "error"), while the engine goes on serving every other request.

vLLM 0.32 counts each request's NaN logits when VLLM_COMPUTE_NANS_IN_LOGITS is set (on the
device, carried with the step's output) and with VLLM_RAISE_ON_LOGIT_NANS raises, which stops
the whole engine; otherwise it only records the count. River's scheduler ends such requests
through vLLM's own request-error path: the set of requests the scheduler finishes as errors in
the same update (`encoder_cache_mismatch_reqs`, which vLLM consumes there). Which layer went
non-finite vLLM cannot replay; the log line names the model and the requests.
"""

from __future__ import annotations

import logging

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

log = logging.getLogger("river_vllm")
# what `river serve` and River's vLLM engines set: the count vLLM leaves off by default
ENV = {"VLLM_COMPUTE_NANS_IN_LOGITS": "1"}


class _FailsNonFinite:
    def update_from_output(self, scheduler_output, model_runner_output):
        bad = {r for r, n in (model_runner_output.num_nans_in_logits or {}).items() if n}
        if bad:
            log.error("%s on the vllm engine gave non-finite logits (NaN) for request(s) %s: "
                      "ended as request errors (vLLM cannot tell which layer)",
                      self.vllm_config.model_config.model, ", ".join(sorted(bad)))
            self.encoder_cache_mismatch_reqs.update(bad)   # finished as errors below
        return super().update_from_output(scheduler_output, model_runner_output)


class FailsNonFinite(_FailsNonFinite, Scheduler):
    """vLLM's scheduler, ending a request with NaN logits as a request error."""


class AsyncFailsNonFinite(_FailsNonFinite, AsyncScheduler):
    """The same for vLLM's async scheduling (its default on CUDA)."""


def scheduler(vllm_config, **kwargs):
    """vLLM's `scheduler_cls` for River (`--scheduler-cls river_vllm.nonfinite.scheduler`):
    the async variant where vLLM schedules asynchronously, so River keeps vLLM's choice."""
    cls = AsyncFailsNonFinite if vllm_config.scheduler_config.async_scheduling \
        else FailsNonFinite
    return cls(vllm_config=vllm_config, **kwargs)
