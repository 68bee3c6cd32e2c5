"""PyTorch's distributed_test.py as a test case class for the backend in $BACKEND, the way PyTorch's
test/distributed/test_distributed_spawn.py makes it for its own backends. For BACKEND=loom, loom_torch registers
the backend and loom is declared as PyTorch declares a plug-in backend (with gloo's "ddp" and "subgroup" features)
before the suite is imported, since its skips are decided at import. A module of its own: the ranks, spawned per
test, unpickle the class by this module's name. Used by torch_suite.py."""
import os

if os.environ["BACKEND"] == "loom":
    import loom_torch  # noqa: F401  (registers the backend)
from torch.testing._internal.common_distributed import DistTestCases

if os.environ["BACKEND"] == "loom":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("loom")
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
