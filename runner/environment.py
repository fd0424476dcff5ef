"""The environment a run gets: an allow-list of the service's variables, never its secrets.

Stdlib only. Guaranteed: only names on the allow-list (or named by the caller in ``pass_names``)
are copied from the source environment; OVERNIGHT_TOKEN, OVERNIGHT_DB and LLM API keys are
never among them unless a target names them itself. Not guaranteed: that a variable the target
passes is safe.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Copied as they are: what a shell, Python, locale and the accelerator stack need.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "LD_LIBRARY_PATH", "HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH", "PYTORCH_", "TRITON_", "NCCL_",
                    "HIP_", "ROCM_", "MPS_", "XLA_", "CUBLAS_", "CUDNN_")
# OVERNIGHT_* variables are the target's own settings (OVERNIGHT_DATA_DIR, ...), except these,
# which are the service's: where its database, token and LLM configuration are.
RUN_PREFIX = "OVERNIGHT_"
SERVICE_NAMES = frozenset({"OVERNIGHT_DB", "OVERNIGHT_LLM_CONFIG"})
# Never copied by the allow-list, even if a prefix above would match.
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY", re.I)


def is_allowed(name: str) -> bool:
    """True for a variable the allow-list passes on to a run."""
    if SECRET.search(name) or name in SERVICE_NAMES:
        return False
    return name in ALLOWED_NAMES or name.startswith((*ALLOWED_PREFIXES, RUN_PREFIX))


def guest_environment(
    source: Mapping[str, str], extra: Mapping[str, str] | None = None,
    pass_names: Iterable[str] = (),
) -> dict[str, str]:
    """The allow-listed part of ``source``, the names in ``pass_names``, then ``extra`` on top.

    OVERNIGHT_* variables of the source pass (a target's own settings such as
    OVERNIGHT_DATA_DIR) except the service's (SERVICE_NAMES) and secrets (OVERNIGHT_TOKEN).
    """
    named = set(pass_names)
    env = {k: v for k, v in source.items() if k in named or is_allowed(k)}
    env.update(extra or {})
    return env
