#!/usr/bin/env bash
# Install what the reward sandbox (sandbox/) needs on a Debian host. Idempotent.
#
#   bubblewrap   namespaces (user, mount, net, pid, ipc, uts) + read-only minimal fs view
#   libseccomp2  the seccomp filter compiler (used through pyseccomp, a ctypes binding)
#   util-linux   setpriv/unshare (diagnostics; the sandbox itself drives bwrap directly)
#   python3      the interpreter tenant code runs under inside the sandbox (stdlib only)
#
# `apt-get update` runs only when a package is missing. The PyPI binding `pyseccomp` is
# installed into the Python given by $PYTHON (default: the shared runwatch venv, else python3).
# Finally the script prints the sandbox's own feature probe (`runwatch sandbox features`
# equivalent) so a CI log shows which isolation layers this kernel allows.
set -euo pipefail

PKGS=(bubblewrap libseccomp2 util-linux python3)
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup-sandbox: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup-sandbox: debian packages present (${PKGS[*]})"
fi

if [[ -z "${PYTHON:-}" ]]; then
  venv="${RUNWATCH_VENV:-$HOME/.cache/runwatch/venv}"
  if [[ -x "$venv/bin/python" ]]; then
    PYTHON="$venv/bin/python"
  else
    PYTHON="$(command -v python3)"
  fi
fi
if ! "$PYTHON" -c "import pyseccomp" 2>/dev/null; then
  echo "setup-sandbox: installing pyseccomp into $PYTHON"
  "$PYTHON" -m pip install -q "pyseccomp==0.1.2"
fi
"$PYTHON" -c "import pyseccomp; f = pyseccomp.SyscallFilter(pyseccomp.ALLOW); print('setup-sandbox: pyseccomp ok')"

# Print the feature probe; never fail setup on it (the sandbox refuses tiers at run time).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
(cd "$REPO" && "$PYTHON" -c "from sandbox.features import probe; print(probe().describe())") || true
