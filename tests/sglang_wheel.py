"""SGLang's own request/response models and rules, loaded from the pinned wheel at test time.

The workbench never installs SGLang (CUDA only, and it pins its own torch/transformers) and never commits
code copied from it. The tests hold the SGLang adapter and `POST /v1/score` to SGLang's models by reading
them out of `sglang-0.5.23-*.whl` (`make sglang-wheel` downloads it without dependencies into
data/cache/wheels; `WORKBENCH_SGLANG_WHEEL` names another copy). Every file read is first checked against
the sha256 the wheel's RECORD lists for it.

Why not `import sglang...` from the unpacked wheel (tried): `sglang/__init__.py` imports `sglang.srt.utils`,
which imports orjson, and the wheel's METADATA requires ~80 packages (msgspec, pybase64, torch==2.14.1,
transformers==5.19.0, flashinfer, sglang-kernel, ...) that the workbench environment does not have and must not
get (its torch is 2.13 CPU). The first import failed with `ModuleNotFoundError: No module named 'orjson'`;
mocking every missing module instead broke inside `requests` (its optional imports got mocks too). So this
module executes only the statements a test needs, taken from the wheel's source with `ast`:

- `scoring_models()`: `ScoringRequest`, `ScoringResponse`, `UsageInfo`, `ErrorResponse` (pydantic classes of
  `sglang/srt/entrypoints/openai/protocol.py`, with the top-level names they use and their typing/pydantic
  imports), so the classes are SGLang's, not a description of them.
- `api_types()`: the whole generated `sglang/api/v1/api_types.py`: the server's JSON contract gate for
  `/generate` (`entrypoints/api_contract.py` `generate_contract_error` runs `GenerateRequest.from_json_value`
  on every body; unknown `sampling_params` keys are refused there). It needs only `msgspec.Struct` as a
  plain container base; when msgspec is not installed a keyword-only stand-in takes its place (the
  decoders, where the checking happens, are the wheel's).
- `generate_req_input()`: a pydantic model of the dataclass `GenerateReqInput`
  (`sglang/srt/managers/io_struct.py`), which is what FastAPI parses a `/generate` body into. Its field
  names and annotations come from the wheel; the real server IGNORES unknown keys there (a misspelled
  field is silently dropped), so this model forbids them: every key the adapter sends must be a field.
  Annotation names defined outside io_struct (multimodal and enum types) resolve to `Any`.
- `sampling_params_fields()`, `beam_generate_response(...)`, `beam_score(...)`, `server_flags()`, `method(...)`
  (one method of a heavy class, run from its source) and `message(...)` (a server error text, verbatim from
  the wheel at test time): the other rules (see each).
"""

from __future__ import annotations

import ast
import base64
import builtins
import functools
import hashlib
import os
import sys
import types
import typing
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / "data" / "cache" / "wheels"  # Makefile: SGLANG_WHEEL_DIR

PROTOCOL = "sglang/srt/entrypoints/openai/protocol.py"
API_TYPES = "sglang/api/v1/api_types.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
FIELD_VALIDATORS = "sglang/srt/utils/field_validators.py"
SAMPLING_PARAMS = "sglang/srt/sampling/sampling_params.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
SCORE_MIXIN = "sglang/srt/managers/tokenizer_manager_score_mixin.py"
BEAM_TYPES = "sglang/srt/beam_search/types.py"
BEAM_OUTPUT = "sglang/srt/beam_search/output.py"
BEAM_GROUP = "sglang/srt/beam_search/beam_group.py"
BEAM_COORDINATOR = "sglang/srt/beam_search/coordinator.py"
ARG_FIELDS_DIR = "sglang/srt/arg_groups/fields/"
ARG_CHOICES = "sglang/srt/arg_groups/choices.py"

# Imports kept when statements are lifted out of a wheel file: only light, installed modules.
LIGHT_IMPORTS = ("__future__", "typing", "typing_extensions", "pydantic", "dataclasses", "enum", "math", "array")


def wheel_path() -> Path | None:
    """The pinned wheel, or None when it has not been downloaded."""
    if os.environ.get("WORKBENCH_SGLANG_WHEEL"):
        p = Path(os.environ["WORKBENCH_SGLANG_WHEEL"])
        return p if p.is_file() else None
    found = sorted(WHEEL_DIR.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return found[0] if found else None


def skip_reason() -> str:
    where = os.environ.get("WORKBENCH_SGLANG_WHEEL") or f"{WHEEL_DIR}/sglang-{SGLANG_VERSION}-*.whl"
    return (f"no sglang {SGLANG_VERSION} wheel at {where} (`make sglang-wheel` downloads it, --no-deps; or set "
            "WORKBENCH_SGLANG_WHEEL): SGLang's own models cannot be loaded this run")


def require_wheel() -> Path:
    """The wheel, or skip the calling test saying how to get it."""
    import pytest

    p = wheel_path()
    if p is None:
        pytest.skip(skip_reason())
    return p


@functools.lru_cache(maxsize=None)
def _record() -> dict[str, str]:
    with zipfile.ZipFile(require_wheel()) as z:
        text = z.read(f"sglang-{SGLANG_VERSION}.dist-info/RECORD").decode()
    out = {}
    for line in text.splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest.startswith("sha256="):
            out[path] = digest[len("sha256="):]
    return out


@functools.lru_cache(maxsize=None)
def source(path: str) -> str:
    """The text of `path` inside the wheel, after checking its sha256 against the wheel's RECORD."""
    with zipfile.ZipFile(require_wheel()) as z:
        raw = z.read(path)
    digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
    want = _record().get(path)
    if want != digest:
        raise AssertionError(f"{path} in {wheel_path()} does not match the wheel's RECORD ({digest} vs {want})")
    return raw.decode()


def paths(prefix: str) -> list[str]:
    """Files of the wheel under `prefix` (RECORD order)."""
    return sorted(p for p in _record() if p.startswith(prefix))


# ---- lifting statements out of a wheel file ------------------------------------------------------------------


def _stmt_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _is_light_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in LIGHT_IMPORTS
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] in LIGHT_IMPORTS for a in node.names)
    return False


def lift(path: str, wanted: tuple[str, ...], *, preset: dict | None = None) -> types.ModuleType:
    """A module holding the wheel's top-level statements that define `wanted`, plus the top-level names they
    use (transitively) and the file's light imports, executed in source order.

    The module is registered in sys.modules under a private name so pydantic can resolve the (postponed)
    annotations against it. `preset`: names bound before execution (stand-ins for heavy imports).
    """
    text = source(path)
    tree = ast.parse(text)
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        for name in _stmt_names(node):
            defined[name] = node
    missing = [n for n in wanted if n not in defined]
    if missing:
        raise AssertionError(f"{path} defines no {missing}: sglang {SGLANG_VERSION}'s layout changed")
    keep: set[int] = set()
    todo = [defined[n] for n in wanted]
    while todo:
        node = todo.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        for sub in ast.walk(node):
            ref = sub.id if isinstance(sub, ast.Name) else None
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.isidentifier():
                ref = sub.value  # a forward reference written as a string
            if ref in defined and id(defined[ref]) not in keep:
                todo.append(defined[ref])
    body = [n for n in tree.body if id(n) in keep or _is_light_import(n)]
    name = f"_sglang_wheel_{path.replace('/', '_').removesuffix('.py')}"
    mod = types.ModuleType(name)
    mod.__file__ = f"{wheel_path()}!/{path}"
    mod.__dict__.update(preset or {})
    sys.modules[name] = mod
    exec(compile(ast.Module(body=body, type_ignores=[]), mod.__file__, "exec"), mod.__dict__)  # noqa: S102
    return mod


class _Struct:
    """Stand-in for `msgspec.Struct` as a keyword-only record (used only when msgspec is not installed)."""

    def __init_subclass__(cls, **options):  # kw_only=True, frozen=True, omit_defaults=True, ...
        super().__init_subclass__()

    def __init__(self, **kw):
        fields = {k for c in type(self).__mro__ for k in getattr(c, "__annotations__", {})}
        unknown = set(kw) - fields
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments {sorted(unknown)}")
        for k in fields:
            if k in kw:
                object.__setattr__(self, k, kw[k])


def _msgspec():
    try:
        import msgspec

        return msgspec
    except ImportError:
        return types.SimpleNamespace(Struct=_Struct)


def _exec_whole(path: str, preset: dict) -> types.ModuleType:
    """Execute a whole wheel file whose only non-stdlib import is `import msgspec` (bound from `preset`)."""
    tree = ast.parse(source(path))
    body = [n for n in tree.body if not (isinstance(n, ast.Import) and [a.name for a in n.names] == ["msgspec"])]
    name = f"_sglang_wheel_{path.replace('/', '_').removesuffix('.py')}"
    mod = types.ModuleType(name)
    mod.__file__ = f"{wheel_path()}!/{path}"
    mod.__dict__.update(preset)
    sys.modules[name] = mod
    exec(compile(ast.Module(body=body, type_ignores=[]), mod.__file__, "exec"), mod.__dict__)  # noqa: S102
    return mod


# ---- the models ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def scoring_models() -> types.ModuleType:
    """`ScoringRequest`, `ScoringResponse`, `UsageInfo`, `ErrorResponse` of protocol.py, as SGLang defines them."""
    return lift(PROTOCOL, ("ScoringRequest", "ScoringResponse", "UsageInfo", "ErrorResponse", "DEFAULT_MODEL_NAME"))


@functools.lru_cache(maxsize=None)
def api_types() -> types.ModuleType:
    """The generated JSON contract of the HTTP API (`GenerateRequest`, `SamplingParams`, `GenerateResponse`, ...)."""
    return _exec_whole(API_TYPES, {"msgspec": _msgspec()})


def contract_error(body) -> str | None:
    """What the server's contract gate (`generate_contract_error`) answers for a `/generate` body: None if admitted."""
    api = api_types()
    try:
        api.GenerateRequest.from_json_value(body)
    except api.JsonContractError as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def method(path: str, cls_name: str, name: str, **globals_):
    """The plain function behind method `cls_name.name` of `path` (call it with a stand-in `self`), executed from
    the wheel's source with `math`, `typing` names and `globals_` in scope."""
    tree = ast.parse(source(path))
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    fn = None if cls is None else next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise AssertionError(f"{path} defines no {cls_name}.{name}: sglang {SGLANG_VERSION}'s layout changed")
    fn.decorator_list = []
    import math

    ns: dict = {"math": math, **{k: getattr(typing, k) for k in typing.__all__}, **globals_}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), f"{path}:{cls_name}.{name}", "exec"), ns)  # noqa: S102
    return ns[name]


def message(path: str, starts: str) -> str:
    """The whole string literal of `path` that begins with `starts` (implicitly joined pieces included): the
    server's exact error text."""
    hits = {n.value for n in ast.walk(ast.parse(source(path)))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(starts)}
    if len(hits) != 1:
        raise AssertionError(f"{len(hits)} string literals of {path} start with {starts!r}")
    return hits.pop()


def _class_fields(path: str, cls_name: str) -> dict[str, str]:
    """{field: annotation source} of the annotated class-level fields of `cls_name` in `path`."""
    tree = ast.parse(source(path))
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        raise AssertionError(f"{path} defines no class {cls_name}")
    return {st.target.id: ast.unparse(st.annotation) for st in cls.body
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}


class _AnyForUnknown(dict):
    """eval locals: builtins and known names as themselves, any other name (a type imported from the runtime) Any."""

    def __init__(self, known: dict):
        super().__init__(known)
        self.replaced: set[str] = set()

    def __missing__(self, key):
        if hasattr(builtins, key):
            return getattr(builtins, key)
        self.replaced.add(key)
        return typing.Any


@functools.lru_cache(maxsize=None)
def generate_req_input():
    """A pydantic model of `GenerateReqInput`'s fields (names and annotations from io_struct.py) that forbids
    unknown keys. Returns (model, names resolved to Any)."""
    import pydantic

    validators = lift(FIELD_VALIDATORS, ("validate_optional_list_i64_1d_2d",))
    known = {**{k: getattr(typing, k) for k in typing.__all__}, "PlainValidator": pydantic.PlainValidator,
             "validate_optional_list_i64_1d_2d": validators.validate_optional_list_i64_1d_2d}
    scope = _AnyForUnknown(known)
    fields = {name: (eval(ann, {"__builtins__": builtins}, scope), None)  # noqa: S307 - the wheel's annotations
              for name, ann in _class_fields(IO_STRUCT, "GenerateReqInput").items()}
    model = pydantic.create_model("GenerateReqInput", __config__=pydantic.ConfigDict(
        extra="forbid", arbitrary_types_allowed=True), **fields)
    return model, frozenset(scope.replaced)


@functools.lru_cache(maxsize=None)
def sampling_params_fields() -> frozenset[str]:
    """Keyword arguments `SamplingParams` (sampling/sampling_params.py, a kw-only msgspec.Struct) accepts: the
    tokenizer manager builds it as `SamplingParams(**sampling_params)`, so any other key is a TypeError."""
    return frozenset(_class_fields(SAMPLING_PARAMS, "SamplingParams"))


# ---- beam search: what /generate answers ------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _beam_modules():
    ms = _msgspec()
    seq = lift(BEAM_TYPES, ("BeamSearchSequence",), preset={"msgspec": ms})

    class BatchStrOutput:  # the detokenizer's batch (texts filled): only its type matters to the builder
        pass

    out = lift(BEAM_OUTPUT, ("_build_beam_search_out_dict", "build_beam_search_out", "beam_completion_tokens"),
               preset={"BatchStrOutput": BatchStrOutput, "BatchTokenIDOutput": type("BatchTokenIDOutput", (), {})})
    return seq, out, BatchStrOutput


def default_length_penalty() -> float:
    """`BeamGroup.__init__`'s default `length_penalty` (beam_group.py)."""
    tree = ast.parse(source(BEAM_GROUP))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BeamGroup")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        if a.arg == "length_penalty":
            return float(ast.literal_eval(d))
    raise AssertionError("BeamGroup.__init__ has no length_penalty keyword")


def coordinator_beam_group_keywords() -> set[str]:
    """Keywords `BeamCoordinator` passes to `BeamGroup(...)` (coordinator.py): no `length_penalty` means the default."""
    tree = ast.parse(source(BEAM_COORDINATOR))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "BeamGroup"]
    if len(calls) != 1:
        raise AssertionError(f"expected one BeamGroup(...) call in coordinator.py, found {len(calls)}")
    return {k.arg for k in calls[0].keywords}


def beam_score(cum_logprob: float, num_tokens: int) -> float:
    """`BeamGroup.beam_score` (beam_group.py), run from the wheel's source with the group's length penalty."""
    if "length_penalty" in coordinator_beam_group_keywords():
        raise AssertionError("coordinator.py passes length_penalty to BeamGroup: the score conversion must change")
    fn = method(BEAM_GROUP, "BeamGroup", "beam_score")
    return fn(types.SimpleNamespace(length_penalty=default_length_penalty()), cum_logprob, num_tokens)


def beam_generate_response(beams: list[tuple[list[int], float]], meta_info: dict, *, with_text: bool = True) -> dict:
    """The `/generate` answer to a beam request, built by the wheel's own code: `BeamSearchSequence` per beam
    (tokens, cum_logprob, beam_score from `beam_score`), `_build_beam_search_out_dict` (finished beams ->
    {"beam_results": [...]}) and `build_beam_search_out` (tokenizer_manager.py flattens it: best beam at the
    top level, all of them under meta_info.beam_results). `beams` best first, as `BeamGroup.finalize` sorts."""
    seq_mod, out_mod, batch_str = _beam_modules()
    seqs = [seq_mod.BeamSearchSequence(tokens=list(t), cum_logprob=c, beam_score=beam_score(c, len(t)),
                                       finish_reason={"type": "length", "length": len(t)}, text="")
            for t, c in beams]
    recv = batch_str() if with_text else object()
    built = out_mod._build_beam_search_out_dict(types.SimpleNamespace(sequences=seqs), dict(meta_info), recv)
    return out_mod.build_beam_search_out(built)


# ---- server flags -----------------------------------------------------------------------------------------------


def _choices(node: ast.expr, named: dict[str, list]) -> list | None:
    """Arg(choices=...) as a list: a literal, or a list named in choices.py; None when computed otherwise."""
    if isinstance(node, ast.Name):
        return named.get(node.id)
    try:
        return list(ast.literal_eval(node))
    except ValueError:
        return None


@functools.lru_cache(maxsize=None)
def server_flags() -> dict[str, dict]:
    """{--flag: {"field", "bool", "choices"}} of `python -m sglang.launch_server`, read from the `A[type, Arg(...)]`
    fields of sglang/srt/arg_groups/fields/*.py the way arg_utils.add_cli_args_from_dataclass builds them:
    `--` + field name with '-' (or Arg(cli_name=...)), plus Arg(aliases=[...]); bool fields are store_true."""
    choice_lists = {}
    for node in ast.parse(source(ARG_CHOICES)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    choice_lists[t.id] = [ast.literal_eval(e) for e in node.value.elts if isinstance(e, ast.Constant)]
    flags: dict[str, dict] = {}
    for path in paths(ARG_FIELDS_DIR):
        if not path.endswith(".py"):
            continue
        for cls in (n for n in ast.parse(source(path)).body if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                ann = getattr(st, "annotation", None)
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                        and isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
                    continue
                parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                typ, meta = ast.unparse(parts[0]), (parts[1] if len(parts) > 1 else None)
                names, choices, no_cli = ["--" + st.target.id.replace("_", "-")], None, False
                if isinstance(meta, ast.Call):
                    for kw in meta.keywords:
                        if kw.arg == "cli_name":
                            names[0] = ast.literal_eval(kw.value)
                        elif kw.arg == "aliases":
                            names += ast.literal_eval(kw.value)
                        elif kw.arg == "choices":
                            choices = _choices(kw.value, choice_lists)
                        elif kw.arg == "no_cli":
                            no_cli = bool(ast.literal_eval(kw.value))
                if no_cli:
                    continue
                for n in names:
                    flags[n] = {"field": st.target.id, "bool": typ in ("bool", "Optional[bool]"), "choices": choices}
    return flags
