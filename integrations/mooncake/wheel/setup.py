# SPDX-License-Identifier: Apache-2.0
import os

from setuptools import setup
from setuptools.dist import Distribution


class CompiledDistribution(Distribution):
    """The package ships compiled libraries, so its wheel is tagged for one
    interpreter ABI and platform instead of py3-none-any."""

    def has_ext_modules(self):
        return True


version = os.environ.get("PXN_WHEEL_VERSION", "")
if not version:
    raise SystemExit("PXN_WHEEL_VERSION is not set: hack/mooncake-wheel.sh sets it")

setup(version=version, distclass=CompiledDistribution)
