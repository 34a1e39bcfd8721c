"""A bounded Jinja2 sandbox for chat templates, which are untrusted code from the model file.

Jinja's sandbox stops attribute and call escapes but not work: `range(100000)` nested twice spins for hours and
`'x' * 2 * 10**9` is constant-folded into 2 GB while compiling. Here every render gets a budget (loop iterations
and calls, characters produced, a wall-clock deadline) that is charged from hooks the template cannot avoid:

* the parsed tree is rewritten so that every `for` iterates through `_loop` (one step per item), every `{{ }}` and
  literal output goes through `_out` (characters charged, captured `{% set %}` blocks included) and every `~`
  through `_concat` (size-checked);
* the sandbox's call and binary-operator hooks (`*`, `**`, `+`, `%` intercepted, which also stops constant
  folding) refuse results longer than MAX_CHARS and integers wider than MAX_INT_BITS before computing them;
* every filter is wrapped (so none is folded at compile time either) and its arguments checked the same way.

Breaking a bound raises BudgetError (a TemplateError); cuca.chat turns every failure into a TokenizerError.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_STEPS = 1 << 18  # loop iterations + calls + outputs per render (real templates: a few thousand)
MAX_CHARS = 1 << 24  # the longest string or list a template may build, and all the text it may produce
MAX_INT_BITS = 1 << 12  # integers a template computes (no 10**10**10)
MAX_ARG = 1 << 20  # an integer argument to a call or filter (widths, counts); safe_range allows 100000 items
DEADLINE_S = 10.0  # wall clock per render


class BudgetError(jinja2.TemplateError):
    """A template went past one of this module's bounds."""


class Budget:
    __slots__ = ("steps", "chars", "deadline")

    def __init__(self, deadline_s: float = DEADLINE_S):
        self.steps, self.chars, self.deadline = MAX_STEPS, MAX_CHARS, time.monotonic() + deadline_s

    def tick(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise BudgetError(f"more than {MAX_STEPS} loop iterations, calls and outputs")
        if time.monotonic() > self.deadline:
            raise BudgetError(f"rendering took longer than {DEADLINE_S:g} s")

    def charge(self, n: int) -> None:
        self.chars -= n
        if self.chars < 0:
            raise BudgetError(f"the template produced more than {MAX_CHARS} characters")


_BUDGET: ContextVar[Budget | None] = ContextVar("cuca_template_budget", default=None)


def _tick() -> None:
    b = _BUDGET.get()
    if b is not None:
        b.tick()


def _size(x: Any) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _check_size(n: int) -> None:
    if n > MAX_CHARS:
        raise BudgetError(f"a value of {n} characters or items (at most {MAX_CHARS})")


def _check_int(v: Any) -> None:
    if type(v) is int and v.bit_length() > MAX_INT_BITS:
        raise BudgetError(f"an integer wider than {MAX_INT_BITS} bits")


def _check_args(args: Iterable[Any]) -> None:
    for a in args:
        if type(a) is int and abs(a) > MAX_ARG:
            raise BudgetError(f"an argument of {a} (at most {MAX_ARG})")


_PCT = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d*))?")
_FIELD = re.compile(r"\{[^{}]*\}")


def _check_format(fmt: Any) -> None:
    """Widths and precisions in a %- or {}-format string are bounded like arguments."""
    if not isinstance(fmt, str):
        return
    nums = [int(n) for m in _PCT.finditer(fmt) for n in m.groups() if n]
    nums += [int(n) for m in _FIELD.finditer(fmt) for n in re.findall(r"\d+", m[0])]
    _check_args(nums)


def _loop(items: Any) -> Iterator[Any]:
    """What every `for` iterates over: the same items, one budget step each."""
    b = _BUDGET.get()
    for x in items:
        if b is not None:
            b.tick()
        yield x


def _out(x: Any) -> Any:
    """What every output expression passes through: its characters are charged to the render."""
    b = _BUDGET.get()
    if b is not None:
        b.tick()
        b.charge(len(x) if isinstance(x, str) else len(str(x)))
    return x


def _concat(*parts: Any) -> str:
    """`a ~ b ~ ...`, refused before joining when the result would be too long."""
    _tick()
    strs = [p if isinstance(p, str) else str(p) for p in parts]
    _check_size(sum(map(len, strs)))
    return "".join(strs)


_HOOKS = (_loop, _out, _concat)


def _call(name: str, args: list[Any], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.ImportedName(f"{__name__}.{name}", lineno=lineno), args, [], None, None, lineno=lineno)


class _Bound(NodeTransformer):
    """Routes loops, outputs and `~` of a parsed template through _loop, _out and _concat."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _call("_loop", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _call("_concat", list(node.nodes), node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [_call("_out", [nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData)
                                     else n], n.lineno) for n in node.nodes]
        return node


def _binop_size(op: str, a: Any, b: Any) -> None:
    """Refuse, before computing it, a `*`, `**` or `+` result that would be too long or too wide."""
    if op == "*":
        if type(a) is int and type(b) is int:
            if a.bit_length() + b.bit_length() > MAX_INT_BITS:
                raise BudgetError(f"an integer wider than {MAX_INT_BITS} bits")
        elif type(b) is int and _size(a):
            _check_size(_size(a) * b)
        elif type(a) is int and _size(b):
            _check_size(_size(b) * a)
    elif op == "**" and type(a) is int and type(b) is int and b > 0 and abs(a) > 1:
        if a.bit_length() * b > MAX_INT_BITS:
            raise BudgetError(f"an integer wider than {MAX_INT_BITS} bits")
    elif op == "+" and _size(a) and _size(b):
        _check_size(_size(a) + _size(b))
    elif op == "%" and isinstance(a, str):
        _check_format(a)
        _check_args(b if isinstance(b, tuple) else (b,))


def _precheck(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Calls whose result can dwarf their arguments: str methods and the filters of the same name."""
    name = getattr(fn, "__name__", "")
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, str):
        args = (owner, *args)
    elif not getattr(fn, "_cuca_filter", False):
        return
    if name == "replace" and len(args) >= 3 and all(isinstance(a, str) for a in args[:3]):
        s, old, new = args[:3]
        hits = s.count(old) if old else len(s) + 1
        _check_size(len(s) + hits * max(0, len(new) - len(old)))
    elif name == "join" and args:
        items = args[1] if isinstance(owner, str) and len(args) > 1 else args[0]
        if isinstance(items, (list, tuple)):
            sep = args[0] if isinstance(owner, str) else (args[1] if len(args) > 1 else kwargs.get("d", ""))
            _check_size(sum(_size(x) or len(str(x)) for x in items) + len(items) * _size(sep))
    elif name == "indent" and args and isinstance(args[0], str):
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        if type(width) is int:
            _check_size(len(args[0]) + (args[0].count("\n") + 1) * width)
    elif name == "sum" and args and isinstance(args[0], (list, tuple)):
        if any(isinstance(x, (list, tuple, str)) for x in args[0]):
            _check_size(sum(_size(x) for x in args[0]))
    elif name == "expandtabs" and args and isinstance(args[0], str):
        size = args[1] if len(args) > 1 else kwargs.get("tabsize", 8)
        if type(size) is int:
            _check_size(len(args[0]) + args[0].count("\t") * size)
    elif name == "translate" and len(args) > 1 and isinstance(args[0], str) and isinstance(args[1], dict):
        _check_size(len(args[0]) * max([_size(v) for v in args[1].values()] + [1]))
    elif name == "wordwrap" and args and isinstance(args[0], str):
        wrap = args[4] if len(args) > 4 else kwargs.get("wrapstring")
        _check_size((len(args[0]) + 1) * max(1, _size(wrap)))
    elif name == "tojson":  # HF's signature: (value, ensure_ascii, indent, ...); indent multiplies the output
        indent = args[2] if len(args) > 2 else kwargs.get("indent")
        if indent is not None and not (type(indent) is int and 0 <= indent <= 64):
            raise BudgetError(f"tojson: indent must be an integer from 0 to 64, got {indent!r}")
    elif name in ("format", "format_map") and args:
        _check_format(args[0])


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    pass_arg = getattr(getattr(fn, "jinja_pass_arg", None), "name", None)

    @jinja2.pass_context
    def bounded(context: Any, *args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_args(args[1:])
        _check_args(kwargs.values())
        _precheck(bounded, args, kwargs)
        first = {"context": context, "eval_context": context.eval_ctx, "environment": context.environment}
        out = fn(first[pass_arg], *args, **kwargs) if pass_arg in first else fn(*args, **kwargs)
        _check_size(_size(out))
        return out

    bounded.__name__ = name
    bounded._cuca_filter = True  # type: ignore[attr-defined]
    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus the bounds of this module; render through `render`."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self.globals.pop("lipsum", None)  # lipsum(n=10**6) loops in Python where no hook sees it

    def bound_filters(self) -> None:
        """Wrap filters added after construction (cuca.chat adds `tojson`)."""
        self.filters = {name: fn if getattr(fn, "_cuca_filter", False) else _bounded_filter(name, fn)
                        for name, fn in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = _Bound().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _binop_size(operator, left, right)
        _check_int(left)
        _check_int(right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if __obj in _HOOKS:  # the rewritten tree's own calls: they charge the budget themselves
            return __obj(*args)
        _tick()
        _check_args(args)
        _check_args(v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars"))
        _precheck(__obj, args, kwargs)
        out = super().call(__context, __obj, *args, **kwargs)
        _check_size(_size(out))
        return out

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        inner = super().wrap_str_format(value)
        if inner is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(fmt)
            out = inner(*args, **kwargs)
            _check_size(len(out))
            return out

        return checked


def render(template: jinja2.Template, deadline_s: float = DEADLINE_S, **context: Any) -> str:
    """Render under a fresh budget; the whole output is bounded as it is produced (by `_out`)."""
    token = _BUDGET.set(Budget(deadline_s))
    try:  # every piece, literal text included, went through _out, which charged its characters
        return "".join(template.generate(**context))
    finally:
        _BUDGET.reset(token)
