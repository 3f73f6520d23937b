"""The layout keeps its shape: data flows dataset -> sizes -> tuning -> plan -> loader ->
metrics, runtime code never imports the tuner, no module imports another that imports it
back (imports inside functions count), and functions stay readable."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = (
    "autoloader.guard",
    "autoloader.loader",
    "autoloader.metrics",
    "autoloader.samplers",
    "autoloader.plan",
    "autoloader.feed",
    "autoloader.job",
    "autoloader.cache",
    "autoloader_plugins",
)
# What the tuner and the loader both need lives below both: neither may be imported here.
BELOW = (
    "autoloader.feed",
    "autoloader.host",
    "autoloader.job",
    "autoloader.thresholds",
    "autoloader.cache",
)


def _modules() -> dict[str, Path]:
    found = {}
    for base in (ROOT / "autoloader", ROOT / "plugins"):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT / "plugins" if base.name == "plugins" else ROOT)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _imports(name: str) -> set[str]:
    """The project modules ``name`` imports, anywhere in it."""
    out = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in MODULES and m != name}


def test_runtime_code_never_imports_the_tuner() -> None:
    offenders = {
        name: sorted(m for m in _imports(name) if m.startswith("autoloader.tuning"))
        for name in MODULES
        if name.startswith(RUNTIME)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("autoloader.tuning", "autoloader.loader"),  # the tuner times loaders built from feed/
        (BELOW, "autoloader.loader"),
        (BELOW, "autoloader.tuning"),
        ("autoloader.metrics", "autoloader.loader"),  # the loader records into metrics/
        ("autoloader.guard", "autoloader.loader"),
        ("autoloader.demo", "autoloader.cli"),  # the command line runs the demo
    ],
)
def test_layers_point_one_way(importer: str | tuple[str, ...], imported: str) -> None:
    offenders = {
        name: sorted(m for m in _imports(name) if m.startswith(imported))
        for name in MODULES
        if name.startswith(importer)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = {name: _imports(name) for name in MODULES}
    cycles = []

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            here = todo.pop()
            if here not in seen:
                seen.add(here)
                todo.extend(graph.get(here, ()))
        return seen

    for name in graph:
        if name in reach(name):
            cycles.append(name)
    assert cycles == []


@pytest.mark.parametrize(("prefix", "limit"), [("autoloader.tuning", 40), ("", 60)])
def test_functions_stay_readable(prefix: str, limit: int) -> None:
    """Statements per function, nested ones included: what a reader must follow, however
    the formatter lays them out (a line count rewarded packing several onto one line).
    The tuner's stages stay shorter: the conductor calls them, they do one thing each."""
    long = []
    for name, tree in TREES.items():
        if not name.startswith(prefix):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1
                if count > limit:
                    long.append(f"{name}.{node.name}: {count} statements")
    assert long == []


def test_the_launcher_environment_is_read_in_one_module() -> None:
    reads = re.compile(r"""environ(?:\.get)?\(?\[?["'](?:LOCAL_RANK|LOCAL_WORLD_SIZE)["']""")
    readers = sorted(name for name, path in MODULES.items() if reads.search(path.read_text()))
    assert readers == ["autoloader.launch"]


def test_the_conductor_does_not_branch_on_being_alone() -> None:
    text = MODULES["autoloader.tuning.tuner"].read_text()
    assert text.count("job is None") <= 1


# the state of torch's iterators and DataLoader that autoloader reads or sets
TORCH_STATE = {
    "_task_info",
    "_rcvd_idx",
    "_workers",
    "_worker_pids_set",
    "_shutdown",
    "_timeout",
    "_in_order",
    "_iterator",
    "_index_queues",
    "_worker_result_queue",
    "_pin_memory_thread",
    "_workers_done_event",
    "_pin_memory_thread_done_event",
    "python_exit_status",
    "_remove_worker_pids",
    "_set_SIGCHLD_handler",
    "MP_STATUS_CHECK_INTERVAL",
}


def test_torchs_private_api_is_reached_through_one_module() -> None:
    """Every private name of torch.utils.data is imported and every piece of its
    iterators' state is read in ``autoloader.compat``, whose import checks them all; the
    iterators elsewhere only override torch's hooks (``_reset``, ``_next_index``, ...)."""
    found = {}
    for name in MODULES:
        if name.startswith("autoloader.compat"):
            continue
        used = set()
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.Attribute) and node.attr in TORCH_STATE:
                used.add(node.attr)
            elif isinstance(node, ast.Constant) and node.value in TORCH_STATE:  # getattr
                used.add(node.value)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch."):
                names = [f"{node.module}.{a.name}" for a in node.names]
                used.update(n for n in names if "._" in n)
            elif isinstance(node, ast.Import):
                used.update(a.name for a in node.names if "._" in a.name)
        if used:
            found[name] = sorted(used)
    assert found == {}


def test_dataset_hooks_are_read_in_one_module() -> None:
    """What autoloader reads from a dataset beyond torch's protocol is declared in
    ``autoloader.datasets.hooks``, and read there only: anywhere else, a hook named in a
    ``getattr``/``hasattr`` or read as an attribute of another object is undocumented API.
    A dataset may call its own hooks (``self.autoloader_blocks()``); plugins, which offer
    the hooks, are not readers of them."""
    from autoloader.datasets import hooks

    named = set(hooks.HOOKS)
    own = {n for n in named if n.startswith("autoloader_")}
    found = {}
    for name, tree in TREES.items():
        if name == "autoloader.datasets.hooks" or not name.startswith("autoloader."):
            continue
        used = set()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in named
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
            ):
                used.add(node.args[1].value)
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in own
                and isinstance(node.ctx, ast.Load)
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                used.add(node.attr)
        if used:
            found[name] = sorted(used)
    assert found == {}


# other libraries' private names autoloader uses, by library: read or set on their objects
# in ``autoloader.compat`` only
OTHERS_PRIVATE = {
    "fsspec": {"_raise_not_found_for_status", "_cat_ranges"},
    "accelerate": {"_add_dataloader", "_remove_dataloader", "_shared_state"},
    "accelerate's mark": {"_is_accelerate_prepared"},
    "lightning": {
        "__pl_saved_args",
        "__pl_saved_kwargs",
        "__pl_saved_default_kwargs",
        "__pl_saved_arg_names",
    },
    "torch_geometric": {"_store", "_slice_dict", "_inc_dict", "_num_graphs", "_num_nodes"},
    "prometheus_client": {"_value", "_upper_bounds", "_buckets", "_sum"},
    "fsspec_xrootd": {"_readonly_filehandle_cache", "_prune_task", "_cache", "_close"},
    "multiprocessing": {
        "_resource_sharer",
        "_forkserver",
        "_forkserver_pid",
        "_inheriting",
        "_fixup_main_from_name",
        "_fixup_main_from_path",
    },
    "argparse": {"_SubParsersAction", "_actions"},
    "torch.distributed": {"_get_default_store"},
}


def test_other_libraries_privates_are_reached_through_one_door() -> None:
    """fsspec's, fsspec-xrootd's, Accelerate's, Lightning's, PyG's, prometheus_client's,
    multiprocessing's, argparse's and torch.distributed's private names are used in ``autoloader.compat`` alone, where each
    is checked against the installed version (``tests/test_compat.py``). A name read as
    our own object's attribute (``self._store``) is ours."""
    private = {n: lib for lib, names in OTHERS_PRIVATE.items() for n in names}
    found = {}
    for name, tree in TREES.items():
        if name.startswith("autoloader.compat"):
            continue
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                ours = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not ours or private[node.attr] == "argparse":
                    used.add(f"{private[node.attr]}: {node.attr}")
            elif isinstance(node, ast.Constant) and node.value in private:  # getattr
                used.add(f"{private[node.value]}: {node.value}")
        if used:
            found[name] = sorted(used)
    assert found == {}


def test_autoloaders_environment_variables_are_read_in_one_module() -> None:
    """Every ``AUTOLOADER_*`` variable is a knob of ``autoloader.knobs``, read by its one
    parser: no other module names one in a string."""
    named = re.compile(r"""["']AUTOLOADER_[A-Z_]+["']""")
    readers = sorted(name for name, path in MODULES.items() if named.search(path.read_text()))
    assert readers == ["autoloader.knobs"]


def test_modules_stay_at_most_600_lines() -> None:
    """A module past 600 lines owns more than one thing: split it by what it owns."""
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 600
    }
    assert long == {}


def test_test_modules_have_names_of_their_own() -> None:
    """The tests' folders are not packages, so pytest imports each test module by its file
    name alone: two of one name in different folders fail the collection of the second."""
    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
