"""Several nodes that save: the CKPTS_DIR sentinel check's logic with fake nodes (rpg/preflight/shared_ckpt.py;
docs/gpu.md#several-nodes). The check itself runs on a real two-node Ray cluster in tests/e2e/test_shared_ckpt_dir."""

from __future__ import annotations

import pytest

from rpg.preflight import shared_ckpt as S


class FakeNodes:
    """Nodes with a filesystem each (`disks[node]`: a dict of path -> text); `mounts` maps nodes onto one disk."""

    def __init__(self, mounts: dict):
        self.mounts, self.disks, self.log = mounts, {}, []

    def _disk(self, node):
        return self.disks.setdefault(self.mounts[node], {})

    def write(self, node, path, name, token):
        self.log.append(("write", node))
        self._disk(node)[f"{path}/{name}"] = token
        return f"/abs/{path}/{name} on host-{node}"

    def read(self, node, path, name):
        self.log.append(("read", node))
        if node == "denied":
            raise PermissionError(13, "Permission denied")
        return self._disk(node)[f"{path}/{name}"] if f"{path}/{name}" in self._disk(node) else _missing()

    def remove(self, node, path, name):
        self.log.append(("remove", node))
        del self._disk(node)[f"{path}/{name}"]

    def problem(self, nodes, path="ckpts/run"):
        return S.shared_dir_problem(path, nodes, self.write, self.read, self.remove)


def _missing():
    raise FileNotFoundError(2, "No such file or directory")


def test_a_shared_folder_passes_and_leaves_nothing_behind():
    fake = FakeNodes({"a": "nfs", "b": "nfs", "c": "nfs"})
    assert fake.problem(["a", "b", "c"]) is None
    assert fake.log == [("write", "a"), ("read", "b"), ("read", "c"), ("remove", "a")]
    assert fake.disks == {"nfs": {}}


def test_node_local_disks_are_refused_with_the_reason_and_the_fix():
    fake = FakeNodes({"a": "a-disk", "b": "b-disk", "c": "a-disk", "denied": "a-disk"})
    message = fake.problem(["a", "b", "c", "denied"])
    print(message)
    assert message.startswith("trainer.default_local_dir='ckpts/run' (recipe knob CKPTS_DIR) is not shared by the 4 "
                              "nodes of this run")  # fmt: skip
    assert "written there on node a (/abs/ckpts/run/.rpg-shared-check-" in message
    assert "node b: no such file" in message and "node denied: PermissionError" in message
    assert "node c" not in message  # it shares a's disk
    assert "latest_checkpointed_iteration.txt" in message and "starts from step 0" in message  # the reason
    assert "Fix: set CKPTS_DIR to a folder on a filesystem every node mounts at the same path" in message
    assert "NNODES=1" in message and "trainer.save_freq=-1" in message
    assert fake.disks["a-disk"] == {}  # the sentinel is removed even when the check fails


def test_another_file_under_the_same_name_is_not_the_same_folder():
    fake = FakeNodes({"a": "a-disk", "b": "b-disk"})
    real_read = fake.read
    fake.read = lambda node, path, name: "a stale token" if node == "b" else real_read(node, path, name)
    assert "node b: another file (content 'a stale token')" in fake.problem(["a", "b"])


def test_one_node_is_not_checked():
    fake = FakeNodes({"a": "a-disk"})
    assert fake.problem(["a"]) is None and fake.log == []


@pytest.mark.parametrize("method", ["remote", "options"])
def test_the_task_runner_starts_only_after_the_check(monkeypatch, method):
    from omegaconf import OmegaConf

    from rpg.preflight.compose import RecipeConfigError

    started = []

    class Runner:
        @staticmethod
        def remote():
            started.append("remote")

        @staticmethod
        def options(**kw):
            started.append("options")
            return Runner

    config = OmegaConf.create({"trainer": {"nnodes": 2, "default_local_dir": "ckpts/x"}})
    monkeypatch.setattr(S, "check", lambda cfg: "not shared")
    with pytest.raises(RecipeConfigError, match="not shared"):
        getattr(S.CheckedTaskRunner(Runner, config), method)()
    assert started == []
    monkeypatch.setattr(S, "check", lambda cfg: None)
    getattr(S.CheckedTaskRunner(Runner, config), method)()
    assert started == [method]


def test_every_node_that_can_hold_a_part_of_the_run_is_checked():
    """A CPU-only head holds the TaskRunner (it writes the step tracker): a GPU run checks it too; a dead node or one
    with neither resource is skipped."""
    nodes = [{"NodeID": "gpu-b", "Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}},
             {"NodeID": "head-cpu", "Alive": True, "Resources": {"CPU": 8.0}},
             {"NodeID": "gpu-a", "Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}},
             {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 8.0}},
             {"NodeID": "nothing", "Alive": True, "Resources": {"memory": 1.0}}]  # fmt: skip
    assert S.run_nodes(nodes) == ["gpu-a", "gpu-b", "head-cpu"]
