"""The build step pyproject.toml cannot say: generate the protobuf and gRPC modules.

build_py writes them into the build tree (so into the wheel) with protogen.py; sdist
copies the .proto files it reads into the sdist's proto/, so that an sdist builds
away from the repository too. Everything else is in pyproject.toml.
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import protogen  # noqa: E402 (beside this file, not installed)


class BuildPyWithProtos(build_py):
    """build_py, then the generated modules beside the package's sources."""

    def run(self):
        super().run()
        try:
            root = protogen.find_proto_root(HERE)
            protogen.generate(self.build_lib, root)
        except protogen.ProtogenError as e:
            raise SystemExit(f"fuselink: {e}") from None


class SdistWithProtos(sdist):
    """sdist, carrying the .proto files protogen.py needs in proto/."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = protogen.find_proto_root(HERE)
        for proto in protogen.API_PROTOS + protogen.RPC_PROTOS:
            target = os.path.join(base_dir, "proto", proto)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(root, proto), target)


setup(cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos})
