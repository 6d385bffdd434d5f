"""A user's Python file (reward function, tools, environment) imported in a child process before
anything is rented, so a package the job will not have is named with its fix, not found by the
trainer after the machines are up (EasyR1's own reward_function/math.py imports `mathruler`).

The file's code runs only in the child (it is data to the CLI: its top-level code may be slow,
loud or hostile), under a time limit, and only its last error line comes back. Every top-level
module the file imports (functions' own imports too: a reward imports lazily) is looked up:
- a local job needs each installed here;
- a cloud job needs each provided by what its nodes install (sky_task.setup_script): r1cloud's
  `train` extra and its trackers' extras, with their dependencies, plus the job folder's
  `requirements.txt` (read from this environment's package metadata).
Then, where all are installed here, the file is imported whole (its top-level code must run).
Imports under `try: … except ImportError` or `if TYPE_CHECKING:` are optional, and a module not
installed here maps to no package, so a cloud job's check leaves it alone.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

TIME_LIMIT = 60  # seconds for the child to import the file

# The child: argv = [file, "here" | "cloud:" + the requirements.txt or nothing, extras as JSON];
# prints one JSON line (the last line is read: the file may print too).
CHILD = r"""
import sys; sys.path[:] = [p for p in sys.path if p]  # not the working folder: its math.py is no `math`
import ast, importlib.util, json, re, sys
from importlib import metadata

path, where, extras = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tree = ast.parse(open(path, encoding="utf-8", errors="replace").read())
optional = set()  # imports under `try: … except ImportError` or `if TYPE_CHECKING:`: not required
for node in ast.walk(tree):
    guarded = isinstance(node, ast.Try) and any(
        isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError", "Exception")
        for h in node.handlers)
    typing = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    for part in (node.body if guarded or typing else []):
        optional |= {id(x) for x in ast.walk(part)}
names = {}  # top-level module -> the line first importing it
for node in ast.walk(tree):
    if id(node) in optional:
        continue
    found = [a.name for a in node.names] if isinstance(node, ast.Import) else (
        [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
    for name in found:
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in ("__future__", "r1cloud"):
            names[top] = min(names.get(top, node.lineno), node.lineno)

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

if where.startswith("cloud:"):
    lines = open(where[6:], encoding="utf-8", errors="replace") if where != "cloud:" else []
    matches = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#")[0]) for line in lines)
    listed = [(m.group(1), set()) for m in matches if m]
    have, seen = set(), set()
    todo = [("r1cloud", set(extras)), *listed]
    while todo:  # what pip installs: the closure of r1cloud[extras]'s and requirements.txt's requirements
        dist, wanted = todo.pop()
        if (norm(dist), frozenset(wanted)) in seen:
            continue
        seen.add((norm(dist), frozenset(wanted)))
        have.add(norm(dist))
        try:
            requires = metadata.distribution(dist).requires or []
        except metadata.PackageNotFoundError:
            continue
        from packaging.requirements import Requirement
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted or {""}):
                todo.append((req.name, set(req.extras)))  # with its extras: r1cloud[train-libs]
    owners = metadata.packages_distributions()
    for name in names:  # a module not installed here maps to no package: not judged
        dists = owners.get(name) or []
        if dists and norm(name) not in have and not any(norm(d) in have for d in dists):
            print(json.dumps({"cloud": name, "dist": dists[0], "line": names[name]}))
            sys.exit(0)

for name in names:
    if importlib.util.find_spec(name) is None:  # a cloud job's node has it: not importable here
        print(json.dumps({} if where.startswith("cloud:") else {"missing": name, "line": names[name]}))
        sys.exit(0)
from r1cloud.rewards.pool import load_module
try:
    load_module(path)
except BaseException as e:
    line = next((f.lineno for f in __import__("traceback").extract_tb(e.__traceback__)
                 if f.filename == path), None)
    if isinstance(e, ModuleNotFoundError) and e.name:
        print(json.dumps({"missing": e.name.split(".")[0], "line": line}))
    else:
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300], "line": line}))
    sys.exit(0)
print(json.dumps({}))
"""


def problem(path: str | Path, folder: Path | None = None, extras: tuple[str, ...] = ("train",)) -> str | None:
    """Why `path` would not import where the job runs, in one line; None when it would. With
    `folder` (a cloud job's uploaded folder), against what the nodes install; else here."""
    path = Path(path)
    requirements = folder / "requirements.txt" if folder is not None else None
    has = requirements is not None and requirements.is_file()
    stamps = (path.stat().st_mtime_ns, requirements.stat().st_mtime_ns if has else 0)
    mode = "here" if folder is None else f"cloud:{requirements if has else ''}"
    got = json.loads(_run(str(path), mode, extras, stamps))
    where = f"{path}:{got['line']}" if got.get("line") else str(path)
    if "cloud" in got:
        return (  # a cloud job's check: `requirements` is the job folder's
            f"{where} imports {got['cloud']}, which a cloud node does not install (it installs r1cloud"
            f"[{','.join(extras)}] and the job folder's requirements.txt): add {got['dist']} to {requirements}"
        )
    if "missing" in got:
        return (
            f"{where} imports {got['missing']}, which is not installed here: pip install the package that "
            f"provides it (often `pip install {got['missing']}`)"
        )
    if "slow" in got:
        return (
            f"{path}: importing it took over {TIME_LIMIT} s: move slow work at its top level into a function"
        )
    if "error" in got:
        return f"{where}: importing it failed: {got['error']}"
    return None


@functools.lru_cache(maxsize=16)
def _run(path: str, mode: str, extras: tuple[str, ...], _stamps: tuple) -> str:
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, path, mode, json.dumps(list(extras))],
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return json.dumps({"slow": True})
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if not lines:
        last = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        return json.dumps({"error": last[:300]})
    return lines[-1]
