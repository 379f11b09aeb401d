"""promtool for the alert rules' tests (tests/unit/test_alert_rules_promtool.py), installed by hack/test.sh before the
unit tier.

Debian ships promtool only inside the `prometheus` package (bookworm 2.42: about 96 MB with its web assets; there is no
promtool-only package). Its postinst enables and starts prometheus.service where systemd runs the machine (in
containers a policy-rc.d usually refuses the start); the tests need only the binary, so a service this script's install
started is stopped and disabled again. A prometheus that was installed before is left as it is.

Usage: python -m tests.promtool   (prints promtool's path; exit 1 naming the failed step)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.testbed import build

PACKAGE = "prometheus"
INSTALL_HINT = ("promtool is missing: it comes with Debian's prometheus package, which hack/test.sh installs before the "
                "unit tier (`make units`, or `python -m tests.promtool`; by hand: "
                "`apt-get install -y --no-install-recommends prometheus`)")


def ensure() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    build.ensure_packages([PACKAGE])
    if os.path.isdir("/run/systemd/system"):
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        subprocess.run(sudo + ["systemctl", "disable", "--now", "prometheus.service"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = shutil.which("promtool")
    if not path:
        raise build.BuildError("apt-get installed %s but promtool is not on PATH" % PACKAGE)
    return path


def main() -> int:
    try:
        print(ensure())
    except build.BuildError as exc:
        print("promtool install failed: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
