"""Static anti-cheat checks: read a candidate's source as a Python AST, before anything of it runs.

Each `check_*` function takes the parsed module and returns a list of `Finding`s; its docstring names
the exploit it defeats, and tests/fixtures/cheats/ holds a candidate that must trip it. The checks read
the AST (never regular expressions over Python text), resolve names through the module's imports and
simple aliases (`F = torch.nn.functional`, `mm = torch.matmul`, `getattr(torch, "matmul")`), and follow
`ModelNew.forward` into the helpers it reaches in the same module. Kernel C++ source embedded in string
literals is read as a stream of C++ tokens with comments and string literals removed, so a CuTe name in
a comment does not count as using CuTe.

Static analysis of Python cannot be complete (operators on tensors, computed attribute names, code
reached through objects it cannot type): the dynamic checks (checks_dynamic: op audit, kernel audit,
global-state snapshots) catch what gets past these. What these checks must never do is flag an honest
kernel, so every rule errs towards silence where the AST leaves a doubt.

`run_static_checks(source, backend=...)` runs every check that applies to the backend: one set of
checks, and `STATIC_CHECK_BACKENDS` (read from the registry, checks.py) says where each applies. The
"own kernels" checks (`check_forward_allowlist`, `check_has_kernel_source`) apply to the backends
whose compute must run in the candidate's own kernels (cute, cuda), `check_uses_cute` to cute alone
(with cuda, CuTe is allowed but not required), every other check to every backend (a "torch"
candidate may compute with PyTorch, but not cheat).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cutegen.config import BACKENDS
from cutegen.errors import ConfigError
from cutegen.evaluate.checks import backends_of
from cutegen.records import Finding

# ------------------------------------------------------------------------------------ allow lists

# What ModelNew.forward may call in the torch namespace when own kernels are required (backends cute
# and cuda). Allocation includes zero/one/constant fills: split-K and atomic reductions need a zeroed
# output, and a constant output only passes a degenerate task, which the trivial-solution probe
# reports separately.
TORCH_ALLOWED_CALLS = frozenset(
    {
        # allocation
        "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like",
        "torch.ones", "torch.ones_like", "torch.full", "torch.full_like",
        # views and layout
        "torch.reshape", "torch.flatten", "torch.unflatten", "torch.permute", "torch.transpose",
        "torch.t", "torch.squeeze", "torch.unsqueeze", "torch.narrow", "torch.select", "torch.chunk",
        "torch.split", "torch.unbind", "torch.movedim", "torch.moveaxis", "torch.swapaxes",
        "torch.swapdims", "torch.as_strided", "torch.broadcast_to", "torch.view_as_real",
        "torch.view_as_complex", "torch.detach",
        # shape, dtype and device queries
        "torch.Size", "torch.device", "torch.is_tensor", "torch.is_floating_point", "torch.is_complex",
        "torch.numel", "torch.finfo", "torch.iinfo", "torch.get_default_dtype", "torch.promote_types",
        "torch.is_grad_enabled", "torch.is_inference_mode_enabled", "torch.jit.is_scripting",
        "torch.compiler.is_compiling",
        # contexts and annotations
        "torch.no_grad", "torch.inference_mode", "torch.autograd.profiler.record_function",
        "torch.profiler.record_function", "torch.cuda.nvtx.range_push", "torch.cuda.nvtx.range_pop",
        "torch.cuda.nvtx.range", "torch.cuda.nvtx.mark",
        # the current device and stream (the runtime launches on the current stream)
        "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.current_device",
        "torch.cuda.device", "torch.cuda.get_device_properties", "torch.cuda.get_device_capability",
        "torch.cuda.get_device_name", "torch.cuda.is_available", "torch.cuda.device_count",
        "torch.cuda.synchronize",
    }
)

# torch calls whose result is not a tensor (for the light type inference below).
_TORCH_NONTENSOR_RESULTS = frozenset(
    {
        "torch.Size", "torch.device", "torch.is_tensor", "torch.is_floating_point", "torch.is_complex",
        "torch.numel", "torch.finfo", "torch.iinfo", "torch.get_default_dtype", "torch.promote_types",
        "torch.no_grad", "torch.inference_mode", "torch.cuda.current_stream", "torch.cuda.default_stream",
        "torch.cuda.current_device", "torch.cuda.device", "torch.cuda.get_device_properties",
        "torch.cuda.get_device_capability", "torch.cuda.get_device_name", "torch.cuda.is_available",
        "torch.cuda.device_count", "torch.cuda.synchronize", "torch.is_grad_enabled",
        # The extension module a KernelBench-format candidate builds: its functions are the
        # candidate's own kernels, whatever they are named (`mod.relu(x)` is not Tensor.relu).
        "torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load",
    }
)

# Tensor methods forward may call: shape/dtype/pointer queries, views, layout prep, allocation.
TENSOR_ALLOWED_METHODS = frozenset(
    {
        "size", "dim", "ndimension", "stride", "numel", "nelement", "data_ptr", "element_size",
        "storage_offset", "is_contiguous", "get_device", "is_floating_point", "is_complex", "is_signed",
        "dim_order", "view", "view_as", "reshape", "reshape_as", "contiguous", "permute", "transpose",
        "t", "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select",
        "chunk", "split", "unbind", "movedim", "moveaxis", "swapaxes", "swapdims", "as_strided",
        "unfold", "detach", "requires_grad_", "new_empty", "new_empty_strided", "new_zeros",
        "new_ones", "new_full", "zero_", "fill_",
        # device moves: no-ops on the evaluator's CUDA tensors (a real copy or a cast shows up as
        # aten._to_copy in the op audit); `.to(<dtype>)` is flagged as a cast below
        "cuda", "to",
    }
)
_DTYPE_NAMES = frozenset(
    {
        "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8",
        "int16", "short", "int32", "int", "int64", "long", "bool", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    }
)
_TENSOR_QUERY_METHODS = frozenset(
    {
        "size", "dim", "ndimension", "stride", "numel", "nelement", "data_ptr", "element_size",
        "storage_offset", "is_contiguous", "get_device", "is_floating_point", "is_complex", "is_signed",
        "dim_order", "item", "tolist",
    }
)
# Operator dunders: calling one by name is calling the operator (`getattr(a, "__matmul__")(b)`).
_OPERATOR_DUNDERS = frozenset(
    f"__{op}__"
    for base in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or",
                 "xor", "lshift", "rshift")
    for op in (base, "r" + base, "i" + base)
) | frozenset({"__neg__", "__pos__", "__abs__", "__invert__", "__lt__", "__le__", "__gt__",
               "__ge__", "__eq__", "__ne__", "__setitem__"})
# Tensor method names that plain Python objects also have (list.sort, dict.values, str.split...):
# flagged only when the receiver is known to be a tensor.
_AMBIGUOUS_METHODS = frozenset({"add", "index", "sort", "values", "real", "imag", "count", "copy"})
_TENSOR_VIEW_ATTRS = frozenset({"T", "mT", "H", "mH", "data", "real", "imag", "grad"})
_NN_NONMODULE_CLASSES = frozenset({"Parameter", "Buffer", "UninitializedParameter"})
_ENTRY_METHODS = ("forward", "__call__", "_call_impl", "__getattr__", "__getattribute__")
_BUILTIN_NONTENSOR = frozenset(
    {
        "len", "int", "float", "str", "bool", "list", "dict", "tuple", "set", "frozenset", "range",
        "isinstance", "issubclass", "id", "hash", "print", "sorted", "enumerate", "zip", "type",
        "repr", "format", "divmod", "round", "callable", "hasattr", "super", "iter", "next",
    }
)


@functools.cache
def _tensor_compute_methods() -> frozenset[str]:
    """Every public callable of torch.Tensor that is not on the allow list, plus operator dunders."""
    import torch  # here, so that importing this module does not import torch

    public = {
        name
        for name in dir(torch.Tensor)
        if not name.startswith("_") and callable(getattr(torch.Tensor, name, None))
    }
    return frozenset((public - TENSOR_ALLOWED_METHODS) | _OPERATOR_DUNDERS)


# --------------------------------------------------------------------------------- module facts

TENSOR, OTHER, UNKNOWN, MODULE, REFMODEL = "tensor", "other", "unknown", "module", "reference"
_OBJECT = "object:"  # prefix: an instance of a class defined in the candidate, e.g. "object:Helper"


@dataclass
class _Facts:
    """What the module defines and imports, for resolving names without running anything."""

    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> dotted import path
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    assigns: dict[str, list[ast.expr]] = field(default_factory=dict)  # module-level names
    star_imports: list[ast.ImportFrom] = field(default_factory=list)
    self_kind_tables: dict[int, dict[str, str]] = field(default_factory=dict)  # id(class) -> table

    @property
    def model_new(self) -> ast.ClassDef | None:
        return self.classes.get("ModelNew")


def _import_aliases(tree: ast.Module, facts: _Facts) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    facts.aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    facts.aliases[root] = root
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    facts.star_imports.append(node)
                else:
                    facts.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"


def _module_assigns(tree: ast.Module, facts: _Facts) -> None:
    """Module-level names and what is assigned to them, including assignments through `global`."""
    global_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            global_names.update(node.names)
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        for name, value in _bindings(scope):
            if scope is tree or name in global_names:
                facts.assigns.setdefault(name, []).append(value)


def _facts(tree: ast.Module) -> _Facts:
    facts = _Facts(tree)
    _import_aliases(tree, facts)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            facts.classes[node.name] = node
    _module_assigns(tree, facts)
    _assignment_aliases(tree, facts)
    return facts


def _assignment_aliases(tree: ast.Module, facts: _Facts) -> None:
    """Names bound (in any scope) only ever to the same import path become aliases of it:
    `F = torch.nn.functional`, `mm = torch.matmul` inside forward, `flags = getattr(torch.backends.cuda,
    "matmul")`. Scopes are merged: a name bound to different things anywhere is left alone."""
    bound: dict[str, list[ast.expr]] = {}
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]
    for scope in scopes:
        for name, value in _bindings(scope):
            bound.setdefault(name, []).append(value)
    for _ in range(3):  # aliases of aliases: `F = torch.nn.functional; relu = F.relu`
        for name, values in bound.items():
            if name in facts.aliases:
                continue
            paths = {_dotted(v, facts.aliases) for v in values}
            if len(paths) == 1 and None not in paths:
                facts.aliases[name] = paths.pop()


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The import path an expression names (`F.relu` -> "torch.nn.functional.relu"), else None.

    Sees through `getattr(x, "name")`, `__import__("mod")`, `importlib.import_module("mod")` and
    `sys.modules["mod"]` with constant strings.
    """
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Subscript):
        key = _const_str(node.slice)
        return key if key and _dotted(node.value, aliases) == "sys.modules" else None
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = _const_str(node.args[1]) if len(node.args) > 1 else None
    if isinstance(node.func, ast.Name) and node.func.id == "getattr" and name is not None:
        base = _dotted(node.args[0], aliases)
        return f"{base}.{name}" if base else None
    module = _const_str(node.args[0])
    if isinstance(node.func, ast.Name) and node.func.id == "__import__" and module:
        return module.split(".")[0]
    if module and _dotted(node.func, aliases) == "importlib.import_module":
        return module
    return None


def _is_torch(dotted: str | None) -> bool:
    return dotted is not None and (dotted == "torch" or dotted.startswith("torch."))


def _attr_call_parts(call: ast.Call) -> tuple[ast.expr, str] | None:
    """(receiver, method) of `recv.method(...)` or `getattr(recv, "method")(...)`."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.value, func.attr
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr":
        name = _const_str(func.args[1]) if len(func.args) > 1 else None
        if name is not None:
            return func.args[0], name
    return None


# ---------------------------------------------------------------------------- bindings and kinds


def _target_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


_UNKNOWN_VALUE = ast.Constant(value=...)  # stands for "bound to something not known statically"


def _bindings(scope: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, value) for every name bound directly in a function or module body (not nested defs)."""
    for node in _walk_own(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in _target_names(target):
                    yield name, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            for name in _target_names(node.target):
                yield name, node.value
        elif isinstance(node, ast.NamedExpr):
            yield node.target.id, node.value
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            for name in _target_names(node.target):
                yield name, _UNKNOWN_VALUE
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            for name in _target_names(node.optional_vars):
                yield name, _UNKNOWN_VALUE


def _walk_own(scope: ast.AST) -> Iterator[ast.AST]:
    """ast.walk over a scope's own body, not into nested function or class definitions."""
    todo = deque(ast.iter_child_nodes(scope))
    while todo:
        node = todo.popleft()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _combine(kinds: list[str]) -> str:
    for strongest in (REFMODEL, MODULE, TENSOR):
        if strongest in kinds:
            return strongest
    if kinds and all(k == kinds[0] for k in kinds):
        return kinds[0]
    return UNKNOWN


@dataclass
class _Scope:
    """A function being read: its parameters' kinds, local bindings and the class `self` belongs to."""

    facts: _Facts
    fn: ast.AST | None
    owner: ast.ClassDef | None = None
    params: dict[str, str] = field(default_factory=dict)
    locals: dict[str, list[ast.expr]] = field(default_factory=dict)
    self_name: str | None = None
    depth: int = 0
    visiting: frozenset[str] = frozenset()  # local names being resolved (cycle guard: `x = x.view(...)`)


def _scope(facts: _Facts, fn: ast.AST | None, owner: ast.ClassDef | None, depth: int = 0) -> _Scope:
    """Parameters of forward and __call__ are taken to be tensors, of __init__ plain values (init
    inputs), of any other function unknown."""
    scope = _Scope(facts, fn, owner, depth=depth)
    if fn is None:
        return scope
    global_names = {n for node in _walk_own(fn) if isinstance(node, ast.Global) for n in node.names}
    for name, value in _bindings(fn):
        if name not in global_names:
            scope.locals.setdefault(name, []).append(value)
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    if owner is not None and positional and not _is_staticmethod(fn):
        scope.self_name = positional[0].arg
        positional = positional[1:]
    name = getattr(fn, "name", "")
    default = TENSOR if name in ("forward", "__call__") else OTHER if name == "__init__" else UNKNOWN
    for arg in [*positional, *args.kwonlyargs]:
        scope.params[arg.arg] = _annotation_kind(arg.annotation, facts) or default
    for arg in (args.vararg, args.kwarg):
        if arg is not None:
            scope.params[arg.arg] = OTHER
    return scope


def _is_staticmethod(fn: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(fn, "decorator_list", ()))


def _annotation_kind(annotation: ast.expr | None, facts: _Facts) -> str | None:
    if annotation is None:
        return None
    dotted = _dotted(annotation, facts.aliases)
    if dotted in ("torch.Tensor", "torch.nn.Parameter"):
        return TENSOR
    if isinstance(annotation, ast.Name) and annotation.id in ("int", "float", "bool", "str"):
        return OTHER
    return None


def _kind(expr: ast.AST, scope: _Scope) -> str:
    """What an expression evaluates to, as far as the AST shows: TENSOR, MODULE (a torch.nn module),
    REFMODEL (an instance of the reference Model), "object:C" (a class of the candidate), OTHER
    (a plain value, a kernel handle, a module) or UNKNOWN."""
    if scope.depth > 12:
        return UNKNOWN
    if isinstance(expr, ast.Name):
        return _name_kind(expr.id, scope)
    if isinstance(expr, ast.Call):
        return _call_kind(expr, scope)
    if isinstance(expr, ast.Attribute):
        return _attribute_kind(expr, scope)
    if isinstance(expr, ast.Subscript):
        base = _kind(expr.value, scope)
        return base if base in (TENSOR, MODULE, REFMODEL) else (OTHER if base == OTHER else UNKNOWN)
    if isinstance(expr, ast.BinOp):
        return _combine([_kind(expr.left, scope), _kind(expr.right, scope)])
    if isinstance(expr, ast.UnaryOp):
        return _kind(expr.operand, scope)
    if isinstance(expr, ast.IfExp):
        return _combine([_kind(expr.body, scope), _kind(expr.orelse, scope)])
    if isinstance(expr, ast.NamedExpr):
        return _kind(expr.value, scope)
    if expr is _UNKNOWN_VALUE:
        return UNKNOWN
    if isinstance(expr, (ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Dict, ast.Set,
                         ast.ListComp, ast.DictComp, ast.SetComp, ast.Lambda, ast.Compare, ast.BoolOp)):
        return OTHER
    return UNKNOWN


def _deeper(scope: _Scope, name: str | None = None) -> _Scope:
    visiting = scope.visiting | {name} if name else scope.visiting
    return dataclasses.replace(scope, depth=scope.depth + 1, visiting=visiting)


def _name_kind(name: str, scope: _Scope) -> str:
    facts = scope.facts
    if name == scope.self_name:
        return OTHER  # the module instance itself
    if name in scope.params:
        return scope.params[name]
    if name in scope.locals:
        if name in scope.visiting:
            return UNKNOWN
        inner = _deeper(scope, name)
        return _combine([_kind(v, inner) for v in scope.locals[name]])
    if name in facts.aliases or name in facts.functions or name in facts.classes:
        return OTHER
    if name in facts.assigns:
        module_scope = _Scope(facts, None, depth=scope.depth + 1)
        kind = _combine([_kind(v, module_scope) for v in facts.assigns[name]])
        return OTHER if kind == UNKNOWN else kind  # module-level state: kernel handles, constants
    return UNKNOWN


def _call_kind(call: ast.Call, scope: _Scope) -> str:
    facts = scope.facts
    dotted = _dotted(call.func, facts.aliases)
    if _is_torch(dotted):
        last = dotted.rsplit(".", 1)[-1]  # type: ignore[union-attr]
        if dotted in _TORCH_NONTENSOR_RESULTS:
            return OTHER
        if dotted.startswith("torch.nn.") and last[:1].isupper():  # type: ignore[union-attr]
            return TENSOR if last in _NN_NONMODULE_CLASSES else MODULE
        return TENSOR
    if dotted is not None:
        return REFMODEL if dotted.endswith(".Model") else OTHER  # a non-torch library: a handle
    if isinstance(call.func, ast.Name):
        name = call.func.id
        if name == "Model":
            return REFMODEL
        if name in facts.classes:
            return _OBJECT + name
        if name in facts.functions:
            return _return_kind(facts.functions[name], scope, None)
        if name in _BUILTIN_NONTENSOR:
            return OTHER
    parts = _attr_call_parts(call)
    if parts is not None and isinstance(parts[0], ast.Name) and parts[0].id == scope.self_name:
        method = _methods(scope.owner, facts).get(parts[1]) if scope.owner is not None else None
        return _return_kind(method, scope, scope.owner) if method is not None else OTHER
    if parts is not None:
        receiver = _kind(parts[0], _deeper(scope))
        if receiver == TENSOR:
            return OTHER if parts[1] in _TENSOR_QUERY_METHODS else TENSOR
        if receiver in (MODULE, REFMODEL):
            return TENSOR if parts[1] in ("forward", "__call__") else OTHER
        return OTHER if receiver == OTHER or receiver.startswith(_OBJECT) else UNKNOWN
    callee = _kind(call.func, _deeper(scope))
    return TENSOR if callee in (MODULE, REFMODEL) else UNKNOWN


def _return_kind(fn: ast.AST, scope: _Scope, owner: ast.ClassDef | None) -> str:
    if scope.depth > 8:
        return UNKNOWN
    inner = _scope(scope.facts, fn, owner, depth=scope.depth + 1)
    if isinstance(fn, ast.Lambda):
        return _kind(fn.body, inner)
    values = [n.value for n in _walk_own(fn) if isinstance(n, ast.Return) and n.value is not None]
    return _combine([_kind(v, inner) for v in values]) if values else OTHER


def _attribute_kind(expr: ast.Attribute, scope: _Scope) -> str:
    if isinstance(expr.value, ast.Name) and expr.value.id == scope.self_name and scope.owner:
        if expr.attr in _methods(scope.owner, scope.facts):
            return OTHER
        return _self_kinds(scope.owner, scope.facts).get(expr.attr, OTHER)
    if _dotted(expr, scope.facts.aliases) is not None:
        return OTHER  # a module, a dtype, a function object
    base = _kind(expr.value, _deeper(scope))
    if base == TENSOR:
        return TENSOR if expr.attr in _TENSOR_VIEW_ATTRS else OTHER
    if base == MODULE:
        return TENSOR if expr.attr.endswith(("weight", "bias")) or expr.attr.startswith("running_") else MODULE
    return base if base in (REFMODEL, OTHER) else UNKNOWN


# ------------------------------------------------------------------------- classes and reachability


def _class_chain(cls: ast.ClassDef, facts: _Facts) -> list[ast.ClassDef]:
    """The class and its bases defined in the same module, nearest first (a simple MRO)."""
    chain, todo = [], [cls]
    while todo:
        current = todo.pop(0)
        if current in chain:
            continue
        chain.append(current)
        for base in current.bases:
            if isinstance(base, ast.Name) and base.id in facts.classes:
                todo.append(facts.classes[base.id])
    return chain


def _methods(cls: ast.ClassDef, facts: _Facts) -> dict[str, ast.AST]:
    """Methods (and `name = function_or_lambda` class attributes) of a class and its in-module bases."""
    found: dict[str, ast.AST] = {}
    for klass in _class_chain(cls, facts):
        for node in klass.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(node.name, node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                if isinstance(target, ast.Name) and isinstance(value, ast.Lambda):
                    found.setdefault(target.id, value)
                elif isinstance(target, ast.Name) and isinstance(value, ast.Name):
                    if value.id in facts.functions:
                        found.setdefault(target.id, facts.functions[value.id])
    return found


def _self_kinds(cls: ast.ClassDef, facts: _Facts) -> dict[str, str]:
    """Kinds of `self.<attr>` as assigned anywhere in the class (nn modules, parameters, handles...).

    Built once per class, __init__ first and in source order, so `self.w = self.linear.weight` sees
    `self.linear`; while it is being built, lookups see the partial table (no recursion)."""
    table = facts.self_kind_tables.get(id(cls))
    if table is None:
        table = facts.self_kind_tables[id(cls)] = {}
        methods = sorted(_methods(cls, facts).items(), key=lambda kv: kv[0] != "__init__")
        for _, method in methods:
            if isinstance(method, ast.Lambda):
                continue
            scope = _scope(facts, method, cls)
            nodes = sorted(_walk_own(method), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
            for node in nodes:
                for attr, kind in _self_assignment(node, scope.self_name or "self", scope):
                    table[attr] = _combine([table[attr], kind]) if attr in table else kind
    return table


def _self_assignment(node: ast.AST, self_name: str, scope: _Scope) -> Iterator[tuple[str, str]]:
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                if target.value.id == self_name:
                    kind = _kind(node.value, scope)
                    yield target.attr, (OTHER if kind == UNKNOWN else kind)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        name = _const_str(node.args[0])
        if node.func.attr in ("register_buffer", "register_parameter") and name:
            yield name, TENSOR
        elif node.func.attr == "add_module" and name:
            yield name, MODULE


def _cpu_test(test: ast.AST) -> bool | None:
    """True for a test that holds only off the GPU (`not x.is_cuda`, `x.device.type == "cpu"`,
    `not torch.cuda.is_available()`), False for one that holds only on it (`x.is_cuda`), else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _cpu_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Attribute) and test.attr in ("is_cuda", "is_cpu"):
        return test.attr == "is_cpu"
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "is_available":
        return False if ast.unparse(test.func.value).endswith("cuda") else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
        sides = [test.left, test.comparators[0]]
        device = next((_const_str(x) for x in sides if _const_str(x) in ("cpu", "cuda")), None)
        typed = any(isinstance(x, ast.Attribute) and x.attr == "type" for x in sides)
        if device and typed:
            return (device == "cpu") == isinstance(test.ops[0], ast.Eq)
    if isinstance(test, ast.BoolOp):
        parts = [_cpu_test(v) for v in test.values]
        if isinstance(test.op, ast.Or) and all(p is True for p in parts):
            return True
        if isinstance(test.op, ast.And) and any(p is True for p in parts):
            return True
    return None


def _live_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that skips branches which only run off the GPU (a CPU fallback such as
    `if not x.is_cuda: return x * torch.sigmoid(x)`): the evaluator runs candidates on CUDA tensors,
    so such code never executes there, and the op audit would see it if it did."""
    todo = deque([fn])
    while todo:
        node = todo.popleft()
        yield node
        if isinstance(node, (ast.If, ast.IfExp)):
            cpu_only = _cpu_test(node.test)
            body = node.body if isinstance(node.body, list) else [node.body]
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            todo.append(node.test)
            todo.extend(body if cpu_only is not True else [])
            todo.extend(orelse if cpu_only is not False else [])
        else:
            todo.extend(ast.iter_child_nodes(node))


def _reachable(facts: _Facts) -> list[tuple[ast.AST, ast.ClassDef | None]]:
    """Functions ModelNew.forward (and __call__) can reach in this module: methods through `self.x`,
    module-level functions and classes by name, methods of helper objects stored on `self`."""
    cls = facts.model_new
    if cls is None:
        return []
    methods = _methods(cls, facts)
    todo = [(methods[name], cls) for name in _ENTRY_METHODS if name in methods]
    seen: dict[int, tuple[ast.AST, ast.ClassDef | None]] = {}
    while todo:
        fn, owner = todo.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = (fn, owner)
        todo.extend(_callees(fn, owner, facts))
    return list(seen.values())


def _callees(fn: ast.AST, owner: ast.ClassDef | None, facts: _Facts) -> Iterator[tuple[ast.AST, ast.ClassDef | None]]:
    scope = _scope(facts, fn, owner)
    # ModelNew's own chain is reached through `self` only; naming the class (super(ModelNew, self))
    # must not pull __init__ (where weight preparation may compute) into the forward check.
    chain = {c.name for c in _class_chain(facts.model_new, facts)} if facts.model_new else set()
    for node in _live_nodes(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in facts.functions and node.id not in scope.locals:
                yield facts.functions[node.id], None
            elif node.id in facts.classes and node.id != "Model" and node.id not in chain:
                klass = facts.classes[node.id]
                yield from ((m, klass) for m in _methods(klass, facts).values())
            elif node.id in facts.assigns and node.id not in scope.locals:
                yield from _object_methods(_name_kind(node.id, scope), facts)
        elif isinstance(node, ast.Attribute) and owner is not None:
            yield from _self_callees(node, scope, owner, facts)


def _self_callees(node: ast.Attribute, scope: _Scope, owner: ast.ClassDef, facts: _Facts):
    base = node.value
    is_super = isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
    if not (is_super or (isinstance(base, ast.Name) and base.id == scope.self_name)):
        return
    methods = _methods(owner, facts)
    if node.attr in methods:
        yield methods[node.attr], owner
    else:
        yield from _object_methods(_self_kinds(owner, facts).get(node.attr, OTHER), facts)


def _object_methods(kind: str, facts: _Facts) -> Iterator[tuple[ast.AST, ast.ClassDef]]:
    if kind.startswith(_OBJECT) and kind[len(_OBJECT):] in facts.classes:
        klass = facts.classes[kind[len(_OBJECT):]]
        yield from ((m, klass) for name, m in _methods(klass, facts).items() if name != "__init__")


def _finding(check: str, node: ast.AST | None, message: str) -> Finding:
    return Finding(check=check, message=message, line=getattr(node, "lineno", None))


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """Findings in source order, each (line, message) once."""
    seen, unique = set(), []
    for finding in sorted(findings, key=lambda f: f.line or 0):
        key = (finding.line, finding.message)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique


def _main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` blocks (self-tests a candidate may carry; never run when loaded)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    parts = [node.test.left, *node.test.comparators]
    return any(isinstance(p, ast.Name) and p.id == "__name__" for p in parts) and any(
        _const_str(p) == "__main__" for p in parts
    )


def _module_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of the module except those inside `if __name__ == "__main__":` blocks."""
    for stmt in tree.body:
        if not _main_guard(stmt):
            yield from ast.walk(stmt)


def _references(tree: ast.Module, facts: _Facts) -> Iterator[tuple[ast.AST, str]]:
    """(node, dotted path) of every name or attribute (outermost only) that resolves to an import."""
    inner: set[int] = set()
    for node in _module_nodes(tree):
        if isinstance(node, (ast.Attribute, ast.Name, ast.Call, ast.Subscript)) and id(node) not in inner:
            dotted = _dotted(node, facts.aliases)
            if dotted is not None:
                yield node, dotted
                inner.update(id(n) for n in ast.walk(node) if n is not node)


def _matches(dotted: str, names: frozenset[str] | tuple[str, ...]) -> bool:
    """`dotted` is one of `names` or inside one of them (`threading.Thread` is inside `threading`)."""
    return any(dotted == name or dotted.startswith(name + ".") for name in names)


# ------------------------------------------------------------------------------- the checks


def check_forward_allowlist(tree: ast.Module) -> list[Finding]:
    """Defeats computing the answer with PyTorch instead of the candidate's own kernels.

    Where own kernels are required (backends cute and cuda), ModelNew.forward and every helper it
    reaches in the module may only allocate (`torch.empty*`, `zeros`, `ones`, `full`, `new_*`), take
    views and layout copies (`view`, `reshape`, `permute`, `contiguous`...), query shapes, dtypes,
    devices and pointers, and call the candidate's kernels. Flagged: calls into the torch namespace
    outside that list (`torch.matmul`, `F.relu`, `torch.ops.aten.mm`), tensor compute methods
    (`x.sum()`, `getattr(a, "__matmul__")(b)`), the `@` operator, calling a `torch.nn` module held by
    the model (`self.linear(x)`), and any use of the reference `Model`. Other operators on tensors
    (`x * y`) cannot be typed statically: the op audit catches them.
    """
    facts = _facts(tree)
    name = "check_forward_allowlist"
    if facts.model_new is None:
        return [_finding(name, None, "The candidate defines no class ModelNew; define `class ModelNew(nn.Module)`"
                         " with the reference Model's constructor signature and a forward method.")]
    findings = [
        _finding(name, node, f"`from {node.module} import *` hides which torch functions forward calls;"
                             " import the names you need explicitly.")
        for node in facts.star_imports if _is_torch(node.module)
    ]
    for fn, owner in _reachable(facts):
        scope = _scope(facts, fn, owner)
        where = _describe(fn, owner)
        for node in _live_nodes(fn):
            problem = _forward_problem(node, scope)
            if problem:
                findings.append(_finding(name, node, f"{where} {problem}. The candidate's own kernels must do"
                                         " the computation: forward may only allocate outputs, take views and"
                                         " launch them, so do this computation in a kernel of your own."))
    return _dedupe(findings)


def _describe(fn: ast.AST, owner: ast.ClassDef | None) -> str:
    fn_name = getattr(fn, "name", "<lambda>")
    return f"{owner.name}.{fn_name}" if owner is not None else f"{fn_name} (reached from ModelNew.forward)"


def _forward_problem(node: ast.AST, scope: _Scope) -> str | None:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
        return "uses the `@` operator (a PyTorch matmul)"
    if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
        return "uses the reference Model"
    if isinstance(node, ast.Call):
        return _call_problem(node, scope)
    return None


def _call_problem(call: ast.Call, scope: _Scope) -> str | None:
    dotted = _dotted(call.func, scope.facts.aliases)
    if _is_torch(dotted):
        return None if dotted in TORCH_ALLOWED_CALLS else f"calls {dotted}"
    callee = _kind(call.func, scope)
    if callee == MODULE:
        return f"calls the torch.nn module `{ast.unparse(call.func)}`"
    if callee == REFMODEL:
        return f"calls the reference Model through `{ast.unparse(call.func)}`"
    parts = _attr_call_parts(call)
    if parts is None:
        return None
    receiver, method = parts
    kind = _kind(receiver, scope)
    if method == "to" and kind in (TENSOR, UNKNOWN) and _casts(call, scope.facts):
        return "casts with `.to(<dtype>)` (a PyTorch copy kernel)"
    if kind in (MODULE, REFMODEL) and method in ("forward", "__call__", "_call_impl"):
        return f"calls `{ast.unparse(receiver)}.{method}`"
    if method not in _tensor_compute_methods() or kind not in (TENSOR, UNKNOWN):
        return None
    if kind == UNKNOWN and method in _AMBIGUOUS_METHODS:
        return None
    return f"calls the tensor method `.{method}()` (a PyTorch compute op)"


def _casts(call: ast.Call, facts: _Facts) -> bool:
    """`.to(torch.float16)` or `.to(..., dtype=...)`: a dtype conversion, not a device move."""
    if any(k.arg == "dtype" for k in call.keywords):
        return True
    for arg in call.args:
        dotted = _dotted(arg, facts.aliases)
        if dotted is not None and dotted.startswith("torch.") and dotted[len("torch."):] in _DTYPE_NAMES:
            return True
    return False


def check_not_model_subclass(tree: ast.Module) -> list[Finding]:
    """Defeats inheriting or wrapping the reference: `class ModelNew(Model)` that calls
    `super().forward`, or a ModelNew that builds a `Model` and calls it.

    Flags ModelNew (or an in-module base of it) subclassing `Model`, and any use of the name `Model`
    outside the reference's own class definition and `if __name__ == "__main__":` blocks.
    """
    facts = _facts(tree)
    name = "check_not_model_subclass"
    findings = []
    if facts.model_new is not None:
        for cls in _class_chain(facts.model_new, facts):
            for base in cls.bases:
                if _names_model(base, facts):
                    findings.append(_finding(name, base, f"class {cls.name} subclasses the reference Model;"
                                             " ModelNew must subclass torch.nn.Module and compute on its own."))
    reference = facts.classes.get("Model")
    skip = {id(n) for n in ast.walk(reference)} if reference is not None else set()
    for node in _module_nodes(tree):
        if id(node) in skip or not isinstance(getattr(node, "ctx", None), ast.Load):
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and _names_model(node, facts):
            findings.append(_finding(name, node, "the candidate uses the reference Model; ModelNew may copy"
                                     " its parameters' shapes but must not build, call or wrap it."))
    return _dedupe(findings)


def _names_model(node: ast.AST, facts: _Facts) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Model" or facts.aliases.get(node.id, "").endswith(".Model")
    return isinstance(node, ast.Attribute) and node.attr == "Model"


_CONCURRENCY_MODULES = (
    "threading", "_thread", "multiprocessing", "concurrent", "subprocess", "asyncio", "signal",
    "sched", "pty", "torch.multiprocessing", "joblib", "ray", "dask",
)
_PROCESS_FUNCTIONS = (
    "os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp",
    "os.register_at_fork", "os.spawnl", "os.spawnle", "os.spawnlp", "os.spawnlpe", "os.spawnv",
    "os.spawnve", "os.spawnvp", "os.spawnvpe", "os.execl", "os.execle", "os.execlp", "os.execlpe",
    "os.execv", "os.execve", "os.execvp", "os.execvpe",
)
_CXX_CONCURRENCY = (
    ("std", "::", "thread"), ("std", "::", "jthread"), ("std", "::", "async"), ("pthread_create",),
    ("fork",), ("vfork",), ("popen",), ("posix_spawn",), ("cudaLaunchHostFunc",),
    ("cudaStreamAddCallback",), ("cuLaunchHostFunc",),
)


def check_no_concurrency(tree: ast.Module) -> list[Finding]:
    """Defeats work done outside the timed call: a thread, process, timer signal or event loop that
    finishes the output after forward returns (or computes it ahead of time), and child processes
    that escape the worker's limits.

    Flags imports and uses of threading, multiprocessing, concurrent.futures, subprocess, asyncio,
    signal (timers), os.fork/system/popen/spawn*/exec*, and in kernel C++ source std::thread,
    std::async, pthread_create, fork/popen and host callbacks (cudaLaunchHostFunc).
    """
    facts = _facts(tree)
    name = "check_no_concurrency"
    findings = []
    for node in _module_nodes(tree):
        modules = _imported_modules(node)
        for module in modules:
            if _matches(module, _CONCURRENCY_MODULES):
                findings.append(_finding(name, node, f"imports {module}: no threads, processes, timers or"
                                         " event loops; do all work inside forward on the current stream."))
    for node, dotted in _references(tree, facts):
        if _matches(dotted, _CONCURRENCY_MODULES) or _matches(dotted, _PROCESS_FUNCTIONS):
            findings.append(_finding(name, node, f"uses {dotted}: no threads, processes, timers or event"
                                     " loops; do all work inside forward on the current stream."))
    for text, node in _cxx_sources(tree):
        for found in _cxx_find(text, _CXX_CONCURRENCY):
            findings.append(_finding(name, node, f"the kernel source uses {found}: no host threads, processes"
                                     " or host callbacks; launch kernels on the stream you are given."))
    return _dedupe(findings)


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


_PRIVATE_STREAMS = (
    "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.stream", "torch.cuda.set_stream",
    "torch.cuda.StreamContext", "torch.cuda.streams", "torch.Stream", "torch.cuda.graph",
    "torch.cuda.graphs", "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables",
    "torch.cuda.use_mem_pool",
)
_CXX_STREAMS = (
    ("cudaStreamCreate",), ("cudaStreamCreateWithFlags",), ("cudaStreamCreateWithPriority",),
    ("cuStreamCreate",), ("cuStreamCreateWithPriority",), ("cudaStreamBeginCapture",),
    ("cudaGraphLaunch",), ("cudaStreamPerThread",),
)


def check_no_private_streams(tree: ast.Module) -> list[Finding]:
    """Defeats running the work on a stream the timing does not wait for (the end event is recorded
    on the current stream), and graph replays that skip the real launches.

    Flags torch.cuda.Stream/ExternalStream, the `torch.cuda.stream(...)` context, set_stream, CUDA
    graph capture and private memory pools in Python, and cudaStreamCreate*, stream capture, graph
    launches and cudaStreamPerThread in kernel C++ source.
    """
    facts = _facts(tree)
    name = "check_no_private_streams"
    findings = []
    for node, dotted in _references(tree, facts):
        if _matches(dotted, _PRIVATE_STREAMS):
            findings.append(_finding(name, node, f"uses {dotted}: launch every kernel on the current stream"
                                     " (torch.cuda.current_stream()), never on a stream or graph of your own."))
    for text, node in _cxx_sources(tree):
        for found in _cxx_find(text, _CXX_STREAMS):
            findings.append(_finding(name, node, f"the kernel source uses {found}: launch on the stream the"
                                     " launcher is given, never on a stream or graph of your own."))
    return _dedupe(findings)


_FRAME_FUNCTIONS = (
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace",
    "sys.setprofile", "sys.monitoring", "sys.call_tracing", "threading.settrace",
    "threading.setprofile", "inspect.currentframe", "inspect.stack", "inspect.trace",
    "inspect.getouterframes", "inspect.getinnerframes", "inspect.getframeinfo",
    "inspect.getgeneratorlocals", "inspect.getcoroutinelocals", "gc.get_referrers",
    "gc.get_referents", "gc.get_objects", "traceback.extract_stack", "traceback.walk_stack",
    "traceback.format_stack", "traceback.print_stack", "traceback.walk_tb", "ctypes.pythonapi",
)
_FRAME_ATTRIBUTES = frozenset(
    {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "ag_frame"}
)


def check_no_frame_access(tree: ast.Module) -> list[Finding]:
    """Defeats reading the evaluator's state: walking up the call stack (`sys._getframe(1).f_locals`)
    to find the reference outputs or the tolerance, scanning the heap (`gc.get_objects()`) for the
    reference's result tensors, or installing a tracer.

    Flags sys._getframe, inspect frame/stack functions, gc referrer/object scans, traceback stack
    walks, sys.settrace/setprofile, ctypes.pythonapi, and `.f_back`/`.f_locals`/`.tb_frame` attributes.
    """
    facts = _facts(tree)
    name = "check_no_frame_access"
    findings = []
    for node, dotted in _references(tree, facts):
        if _matches(dotted, _FRAME_FUNCTIONS):
            findings.append(_finding(name, node, f"uses {dotted}: a candidate may not inspect frames, the"
                                     " heap or the evaluator's state."))
    for node in _module_nodes(tree):
        if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRIBUTES:
            findings.append(_finding(name, node, f"reads .{node.attr}: a candidate may not inspect frames"
                                     " or the evaluator's state."))
    return _dedupe(findings)


_MUTATING_METHODS = frozenset({"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"})


def check_no_globals_write(tree: ast.Module) -> list[Finding]:
    """Defeats rewriting module namespaces behind the AST's back: `globals()["torch"] = fake`,
    `vars(module)[...] = ...`, `mod.__dict__[...] = ...`, `sys.modules[...] = ...` and writes to
    `__builtins__`, which would let a candidate swap what the evaluator (or later checks) resolve.

    Plain `global` statements are allowed: lazily building a kernel into a module-level name is an
    honest pattern, and call-counting through one is caught by the timed-output validation.
    """
    facts = _facts(tree)
    name = "check_no_globals_write"
    findings = []
    for node in _module_nodes(tree):
        container = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            container = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATING_METHODS:
                container = node.func.value
        if container is not None and _is_namespace(container, facts):
            findings.append(_finding(name, node, f"writes into `{ast.unparse(container)}`: a candidate may not"
                                     " rewrite module namespaces; keep state on the module instance."))
        if _is_setattr(node) and _is_module_object(node.args[0], facts):
            findings.append(_finding(name, node, f"sets attributes on the module `{ast.unparse(node.args[0])}`:"
                                     " a candidate may not rewrite module namespaces."))
    return _dedupe(findings)


def _is_setattr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr") and bool(node.args))


def _is_module_object(node: ast.AST, facts: _Facts) -> bool:
    """`sys.modules[...]`, `__import__(...)`, `importlib.import_module(...)`: a module reached by name."""
    if isinstance(node, ast.Subscript):
        return _dotted(node.value, facts.aliases) == "sys.modules"
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "__import__":
            return True
        return _dotted(node.func, facts.aliases) == "importlib.import_module"
    return False


def _is_namespace(node: ast.AST, facts: _Facts) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        of_self = bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
        return node.func.id in ("globals", "vars") and node.func.id not in facts.aliases and not of_self
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return not (isinstance(node.value, ast.Name) and node.value.id == "self")
    if isinstance(node, ast.Name) and node.id == "__builtins__":
        return True
    return _dotted(node, facts.aliases) == "sys.modules"


_GLOBAL_SETTERS = (
    "torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_default_tensor_type",
    "torch.set_default_device", "torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode",
    "torch.set_flush_denormal", "torch.set_grad_enabled", "torch.autograd.set_grad_enabled",
    "torch.manual_seed", "torch.seed", "torch.set_rng_state", "torch.random.manual_seed",
    "torch.random.seed", "torch.random.set_rng_state", "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all", "torch.cuda.set_rng_state",
    "torch.cuda.set_rng_state_all", "torch.cuda.set_sync_debug_mode",
    "torch.cuda.set_per_process_memory_fraction", "torch.cuda.memory.change_current_allocator",
    "torch.cuda.memory._set_allocator_settings", "torch.backends.cudnn.flags",
    "torch.backends.mkldnn.flags", "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp", "torch.backends.cuda.enable_math_sdp",
    "torch.backends.cuda.enable_cudnn_sdp", "torch.backends.cuda.preferred_linalg_library",
    "torch.backends.cuda.preferred_blas_library", "os.putenv", "os.unsetenv", "os.environ.update",
    "os.environ.setdefault", "os.environ.pop", "os.environ.clear", "os.environ.__setitem__",
)


# Switches that turn off the evaluator's instrumentation (the op audit's TorchDispatchMode).
_INSTRUMENTATION_OFF = (
    "torch.utils._python_dispatch._disable_current_modes", "torch.utils._python_dispatch._pop_mode",
    "torch.utils._python_dispatch._pop_mode_temporarily", "torch._C._DisableTorchDispatch",
    "torch._C._DisableTorchFunction", "torch._C.DisableTorchFunction",
    "torch._C.DisableTorchFunctionSubclass", "torch._C._unset_dispatch_mode",
    "torch._C._pop_torch_dispatch_stack", "torch._C._pop_torch_function_stack",
    "torch._C._set_torch_dispatch_mode", "torch._C._disabled_torch_dispatch_impl",
)


def check_no_patching(tree: ast.Module) -> list[Finding]:
    """Defeats changing the rules from inside the candidate: `torch.allclose = lambda *a: True`,
    `torch.cuda.synchronize = noop`, `time.perf_counter = fake`, `torch.backends.cuda.matmul.allow_tf32
    = True` (a free TF32 speedup against an fp32 baseline), `Model.forward = ...`, seeding the global
    RNG so "fresh" inputs become predictable, and environment variables such as
    NVIDIA_TF32_OVERRIDE that change library behaviour.

    Flags assignments, setattr and delattr on attributes of any imported module (torch, time,
    builtins, cutegen...) or of the reference Model, writes to os.environ, and calls of global-state
    setters (set_float32_matmul_precision, set_default_dtype, manual_seed, cudnn.flags...), and
    references to the switches that disable torch dispatch modes (which would blind the op audit).
    """
    facts = _facts(tree)
    name = "check_no_patching"
    findings = []
    for node in _module_nodes(tree):
        for target in _store_targets(node):
            patched = _patched_name(target, facts)
            if patched:
                findings.append(_finding(name, node, f"assigns {patched}: a candidate may not change torch,"
                                         " the timing primitives, the environment or the reference."))
        if isinstance(node, ast.Call):
            problem = _setter_problem(node, facts)
            if problem:
                findings.append(_finding(name, node, problem))
    for node, dotted in _references(tree, facts):
        if _matches(dotted, _INSTRUMENTATION_OFF):
            findings.append(_finding(name, node, f"uses {dotted}, which switches off the evaluator's op"
                                     " audit; a candidate may not touch torch's dispatch machinery."))
    return _dedupe(findings)


def _store_targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        else:
            flat.append(target)
    return flat


def _patched_name(target: ast.expr, facts: _Facts) -> str | None:
    if isinstance(target, ast.Attribute):
        owner = _dotted(target.value, facts.aliases)
        if owner is not None:
            return f"{owner}.{target.attr}"
        if _names_model(target.value, facts):
            return f"Model.{target.attr}"
    if isinstance(target, ast.Subscript) and _dotted(target.value, facts.aliases) == "os.environ":
        return f"os.environ[{ast.unparse(target.slice)}]"
    return None


def _setter_problem(call: ast.Call, facts: _Facts) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and call.args:
        owner = _dotted(call.args[0], facts.aliases)
        if owner is not None or _names_model(call.args[0], facts):
            return (f"{func.id}() on `{ast.unparse(call.args[0])}`: a candidate may not change torch, the"
                    " timing primitives or the reference.")
        return None
    dotted = _dotted(func, facts.aliases)
    if dotted is not None and _matches(dotted, _GLOBAL_SETTERS):
        if dotted.endswith("set_grad_enabled") and _is_with_item(call, facts.tree):
            return None
        return (f"calls {dotted}: a candidate may not change global torch state, the RNG or the"
                " environment; the evaluator sets them for the precision track.")
    return None


def _is_with_item(call: ast.Call, tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.withitem) and node.context_expr is call for node in ast.walk(tree)
    )


_IDENTITY_CALLS = frozenset({"data_ptr", "untyped_storage", "storage", "_cdata", "__hash__", "_typed_storage"})


def check_no_module_cache(tree: ast.Module) -> list[Finding]:
    """Defeats serving a stored result instead of computing: a module-level (or instance) dict keyed
    on `x.data_ptr()`, `id(x)` or the tensor itself, or `functools.lru_cache`/`cache` on a function
    forward calls with its tensors. The evaluator reuses buffers, so identity keys hit on new data.

    Caches keyed on shapes or dtypes (compiled kernels, workspaces) are allowed; a cache of outputs
    keyed on shapes is caught by the timed-output validation on fresh inputs.
    """
    facts = _facts(tree)
    name = "check_no_module_cache"
    cached = _cached_functions(facts)
    findings = []
    for fn, owner in _reachable(facts):
        scope = _scope(facts, fn, owner)
        for node in ast.walk(fn):
            problem = _cache_problem(node, scope, cached)
            if problem:
                findings.append(_finding(name, node, problem + " Compute the output on every call."))
    return _dedupe(findings)


def _cached_functions(facts: _Facts) -> set[str]:
    """Names of functions and methods decorated with functools.lru_cache / cache / cached_property."""
    names = set()
    for node in ast.walk(facts.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                dotted = _dotted(target, facts.aliases) or ""
                if dotted.rsplit(".", 1)[-1] in ("lru_cache", "cache", "cached_property"):
                    names.add(node.name)
    return names


def _cache_problem(node: ast.AST, scope: _Scope, cached: set[str]) -> str | None:
    if isinstance(node, ast.Subscript) and _persistent(node.value, scope) and _identity_key(node.slice, scope):
        return f"indexes `{ast.unparse(node.value)}` by a tensor identity ({ast.unparse(node.slice)})."
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        containers = node.comparators
        if any(_persistent(c, scope) for c in containers) and _identity_key(node.left, scope):
            return f"looks up a tensor identity ({ast.unparse(node.left)}) in a cache."
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("get", "setdefault", "pop", "__getitem__"):
            if _persistent(func.value, scope) and node.args and _identity_key(node.args[0], scope):
                return f"looks up a tensor identity in `{ast.unparse(func.value)}`."
        callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if callee in cached and any(_kind(a, scope) == TENSOR or _identity_key(a, scope) for a in node.args):
            return f"passes tensors to the memoised function {callee} (lru_cache/cache keys on tensor identity)."
    return None


def _persistent(container: ast.AST, scope: _Scope) -> bool:
    """A container that outlives the call: module-level or on `self`, not a local built in the call
    (and not a tensor: `self.table[idx]` is a gather, not a cache)."""
    if _kind(container, scope) in (TENSOR, MODULE):
        return False
    if isinstance(container, ast.Name):
        return container.id not in scope.locals and container.id not in scope.params
    if isinstance(container, ast.Attribute):
        return isinstance(container.value, ast.Name) and container.value.id == scope.self_name
    return False


def _identity_key(key: ast.AST, scope: _Scope, depth: int = 0) -> bool:
    """Does a key carry a tensor's identity: data_ptr(), id(), hash() or a storage anywhere in it, or
    a torch.Tensor-annotated argument as the key (or an item of a tuple key)? A tensor inside a shape
    query (`tuple(x.shape)`) is not its identity."""
    if depth > 4:
        return False
    for node in ast.walk(key):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _IDENTITY_CALLS:
                return True
            if isinstance(func, ast.Name) and func.id in ("id", "hash"):
                return True
        if isinstance(node, ast.Attribute) and node.attr in _IDENTITY_CALLS:
            return True
        if isinstance(node, ast.Name) and node.id in scope.locals and node.id not in scope.visiting:
            inner = _deeper(scope, node.id)
            if any(_identity_key(v, inner, depth + 1) for v in scope.locals[node.id]):
                return True
    items = key.elts if isinstance(key, ast.Tuple) else [key]
    return any(isinstance(k, ast.Name) and _annotated_tensor(k.id, scope) for k in items)


def _annotated_tensor(name: str, scope: _Scope) -> bool:
    fn = scope.fn
    if fn is None or isinstance(fn, ast.Lambda):
        return False
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return any(a.arg == name and _annotation_kind(a.annotation, scope.facts) == TENSOR for a in args)


_DYNAMIC_CODE = (
    "builtins.eval", "builtins.exec", "builtins.compile", "types.FunctionType", "types.CodeType",
    "marshal.loads", "pickle.loads", "dill.loads", "runpy.run_path", "runpy.run_module",
    "importlib.util.spec_from_file_location", "importlib.util.module_from_spec", "code.InteractiveInterpreter",
)


def check_no_dynamic_code(tree: ast.Module) -> list[Finding]:
    """Defeats hiding code from every other static check: `exec`/`eval`/`compile` of a string,
    unpickling or building code objects, importing a module by a computed name, or looking up a torch
    function by a computed name (`getattr(torch, "mat" + "mul")`).
    """
    facts = _facts(tree)
    name = "check_no_dynamic_code"
    findings = []
    for node in _module_nodes(tree):
        if not isinstance(node, ast.Call):
            continue
        problem = _dynamic_problem(node, facts)
        if problem:
            findings.append(_finding(name, node, f"{problem}: every piece of the candidate's code must be"
                                     " visible in its source."))
    return _dedupe(findings)


def _dynamic_problem(call: ast.Call, facts: _Facts) -> str | None:
    func = call.func
    shadowed = isinstance(func, ast.Name) and (func.id in facts.aliases or func.id in facts.functions)
    if isinstance(func, ast.Name) and not shadowed:
        if func.id in ("eval", "exec", "compile"):
            return f"calls {func.id}()"
        if func.id == "__import__" and not (call.args and _const_str(call.args[0])):
            return "imports a module by a computed name"
        if func.id == "getattr" and len(call.args) > 1 and _const_str(call.args[1]) is None:
            if _is_torch(_dotted(call.args[0], facts.aliases)):
                return f"looks up an attribute of {ast.unparse(call.args[0])} by a computed name"
    dotted = _dotted(func, facts.aliases)
    if dotted == "importlib.import_module" and not (call.args and _const_str(call.args[0])):
        return "imports a module by a computed name"
    if dotted is not None and _matches(dotted, _DYNAMIC_CODE):
        return f"calls {dotted}"
    return None


# The CuTe names that mean "this kernel is written with CuTe tensors and layouts".
CUTE_TENSOR_API = frozenset(
    {
        "make_tensor", "make_layout", "make_shape", "make_stride", "make_gmem_ptr", "make_smem_ptr",
        "make_identity_tensor", "make_fragment_like", "make_tensor_like", "make_tiled_copy",
        "make_tiled_mma", "make_ordered_layout", "make_layout_like", "local_tile", "local_partition",
        "partition_S", "partition_D", "partition_A", "partition_B", "partition_C",
        "partition_fragment_A", "partition_fragment_B", "partition_fragment_C", "Layout", "Tensor",
        "ComposedLayout", "TiledMMA", "TiledCopy", "Copy_Atom", "MMA_Atom", "composition",
        "logical_divide", "zipped_divide", "tiled_divide", "flat_divide", "tile_to_shape", "recast",
    }
)


def check_has_kernel_source(tree: ast.Module) -> list[Finding]:
    """Defeats a candidate that has no CUDA kernel of its own where the backend asks for one: a
    forward of allocations and views that returns a constant or a precomputed answer, or compute in
    another kernel language (a Triton kernel launched from Python) that the kernel audit would count
    as the candidate's own, so that an ablation of the kernel language (CuTe against plain CUDA)
    would measure something else.

    Requires kernel C++ source in the module: a string literal (or a concatenation of literals) with
    `__global__` outside comments and string literals, as the cutegen runtime (`CuteKernel`) and
    `load_inline` take it.
    """
    name = "check_has_kernel_source"
    if any("__global__" in _cxx_tokens(text) for text, _ in _cxx_sources(tree)):
        return []
    return [_finding(name, None, "no CUDA kernel source (`__global__`) found in the candidate: write the kernels"
                     " in CUDA C++ in a source string, built by cutegen.runtime.CuteKernel (or load_inline),"
                     " and launch them from forward.")]


def check_uses_cute(tree: ast.Module) -> list[Finding]:
    """Defeats a "CuTe" candidate that is plain CUDA wearing a CuTe include (the CuTe ablation would
    then compare plain CUDA with plain CUDA).

    Requires at least one kernel source to use CuTe tensors or layouts (`cute::make_tensor`,
    `local_tile`, `Layout`... qualified with `cute::` or under `using namespace cute`) outside comments
    and string literals. A module with no kernel source at all is check_has_kernel_source's finding,
    not this one's.
    """
    name = "check_uses_cute"
    sources = _cxx_sources(tree)
    tokens = [_cxx_tokens(text) for text, _ in sources]
    if not any("__global__" in t for t in tokens) or any(_uses_cute(t) for t in tokens):
        return []
    node = sources[0][1] if sources else None
    return [_finding(name, node, "the kernel source does not use CuTe: build the kernel on CuTe tensors and"
                     " layouts (cute::make_tensor, make_layout, local_tile, local_partition...), not raw"
                     " pointer indexing.")]


def _uses_cute(tokens: list[str]) -> bool:
    qualified = any(tokens[i] == "cute" and tokens[i + 1] == "::" for i in range(len(tokens) - 1))
    namespace = any(tokens[i:i + 3] == ["using", "namespace", "cute"] for i in range(len(tokens) - 2))
    return (qualified or namespace) and not CUTE_TENSOR_API.isdisjoint(tokens)


# ------------------------------------------------------------------------------- C++ source text


_CXX_MARKERS = ("__global__", "#include", 'extern "C"', "cute::")


def _cxx_sources(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """String literals (and `+` concatenations of them) that hold C++/CUDA source."""
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        text = _string_value(node)
        if text is not None and any(marker in text for marker in _CXX_MARKERS):
            found.append((text, node))
    return found


def _string_value(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_value(node.left), _string_value(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _cxx_tokens(text: str) -> list[str]:
    """Identifiers, `::` and punctuation of C++ source with comments and string/char literals dropped,
    so a name inside a comment or a string does not count as code."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif text[i] in "\"'":
            i = _skip_literal(text, i)
        elif text[i].isalpha() or text[i] == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            tokens.append(text[i:j])
            i = j
        elif text.startswith("::", i):
            tokens.append("::")
            i += 2
        else:
            if not text[i].isspace():
                tokens.append(text[i])
            i += 1
    return tokens


def _skip_literal(text: str, start: int) -> int:
    """Index just past the string or char literal opening at `start` (escapes honoured; a literal
    left open runs to the end of its line)."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] not in (quote, "\n"):
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _cxx_find(text: str, patterns: tuple[tuple[str, ...], ...]) -> list[str]:
    """The token sequences of `patterns` (e.g. ("std", "::", "thread")) that occur in the source."""
    tokens = _cxx_tokens(text)
    found = []
    for pattern in patterns:
        width = len(pattern)
        if any(tuple(tokens[i:i + width]) == pattern for i in range(len(tokens) - width + 1)):
            found.append("".join(pattern))
    return found


# ------------------------------------------------------------------------------------- running


STATIC_CHECKS: tuple[Callable[[ast.Module], list[Finding]], ...] = (
    check_forward_allowlist,
    check_not_model_subclass,
    check_no_concurrency,
    check_no_private_streams,
    check_no_frame_access,
    check_no_globals_write,
    check_no_patching,
    check_no_module_cache,
    check_no_dynamic_code,
    check_has_kernel_source,
    check_uses_cute,
)
# Where each check applies, as the registry (checks.py) says: the "own kernels" checks to the backends
# that require the candidate's own kernels, the CuTe check to cute alone (cuda accepts any CUDA C++:
# plain, inline PTX or CuTe), every cheat a torch candidate could also try to all.
STATIC_CHECK_BACKENDS: dict[str, frozenset[str]] = {check.__name__: backends_of(check.__name__) for check in STATIC_CHECKS}


def check_backend(backend: str) -> None:
    """Raise a ConfigError for a backend the checks do not know."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"Unknown candidate backend {backend!r}.",
            f"Use one of {', '.join(BACKENDS)}: 'cute' requires the candidate's own kernels written with CuTe,"
            " 'cuda' its own CUDA kernels (CuTe optional), 'torch' allows PyTorch compute in forward.",
        )


def static_checks_for(backend: str) -> tuple[Callable[[ast.Module], list[Finding]], ...]:
    """The static checks that apply to `backend`, in their fixed order."""
    check_backend(backend)
    return tuple(check for check in STATIC_CHECKS if backend in STATIC_CHECK_BACKENDS[check.__name__])


def run_static_checks(source: str, *, backend: str) -> tuple[Finding, ...]:
    """Every static check that applies to `backend` (STATIC_CHECK_BACKENDS), in a fixed order. A
    source that does not parse gives one finding from "run_static_checks" with the line of the syntax
    error."""
    checks = static_checks_for(backend)
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return (Finding("run_static_checks", f"The candidate does not parse: {err.msg}.", err.lineno),)
    findings: list[Finding] = []
    for check in checks:
        try:
            findings.extend(check(tree))
        except RecursionError:
            findings.append(Finding(check.__name__, "The candidate is nested too deeply to analyse.", None))
    return tuple(findings)
