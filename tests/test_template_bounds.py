"""Issue 13 defect 7: the file's chat template is untrusted code; rendering is bounded in steps, size and time,
and every failure is a TokenizerError."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cuca import sandbox
from cuca.chat import ChatTemplate
from cuca.errors import TokenizerError

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 4


def render_guarded(source: str, messages: list[dict[str, Any]] = MESSAGES) -> BaseException | str:
    """Compile and render in a daemon thread (a hang guard: on main these never returned), returning the
    exception or the text."""
    box: list[BaseException | str] = []

    def go() -> None:
        try:
            box.append(ChatTemplate(source, "<s>", "</s>").render(messages))
        except BaseException as e:  # noqa: BLE001
            box.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(120)
    assert box, "the template did not finish"
    return box[0]


@pytest.mark.parametrize("source, match", [
    # the reproducers: nested loops spun forever; the constant-folded 2 GB string escaped as MemoryError
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loop iterations"),
    ("{{ 'x' * 2 * 10**9 }}", "characters or items"),
    # nested loops over the input, with no call inside
    ("{% for a in messages %}" * 8 + "{% endfor %}" * 8, "loop iterations"),
    # doubling by ~ and +, captured output, widths, replace, join, indent, integer growth, recursion
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "characters"),
    ("{% set ns = namespace(s=['x']) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "items"),
    ("{% set s = 'x' * 10000000 %}{% set y %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endset %}", "produced"),
    ("{% for i in range(100000) %}{{ 'y' * 10000 }}{% endfor %}", "produced"),
    ("{{ '%0999999999d' % 1 }}", "argument"),
    ("{{ '{:>999999999}'.format(1) }}", "argument"),
    ("{{ 'x'|center(999999999) }}", "argument"),
    ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", "characters"),
    ("{{ ('a' * 100000).replace('a', 'b' * 100000) }}", "characters"),
    ("{{ (['x' * 1000000] * 100)|join('') }}", "characters"),
    ("{{ ('a\\n' * 100000)|indent(100000) }}", "characters"),
    ("{{ messages|tojson(indent=100000) }}", "indent"),
    ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "bits"),
    ("{{ (10**1000)**1000 }}", "bits"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}", "RecursionError|compile"),
    ("{{ lipsum(1000000) }}", "lipsum|undefined"),
])
def test_hostile_templates_are_tokenizer_errors(source: str, match: str) -> None:
    out = render_guarded(source)
    assert isinstance(out, TokenizerError), f"got {out!r:.200}"
    assert __import__("re").search(match, str(out)), str(out)


def test_the_deadline_is_checked_from_the_hooks() -> None:
    t = sandbox.BoundedEnvironment().from_string("{% for m in messages %}{{ m }}{% endfor %}")
    with pytest.raises(sandbox.BudgetError, match="longer than"):
        sandbox.render(t, deadline_s=-1.0, messages=[1, 2, 3])
    assert sandbox.render(t, messages=[1, 2, 3]) == "123"


def test_ordinary_templates_render_as_before() -> None:
    src = ("{% for m in messages %}{% if loop.first %}[{{ loop.length }}]{% endif %}{{ m['role'] ~ ':' ~ "
           "m['content'] | trim }}{{ ',' if not loop.last }}{% endfor %}{{ '%-3s|' % 'a' }}{{ '{:>4}'.format(7) }}"
           "{{ (messages | map(attribute='role') | list | length) * 2 }}{{ messages[0] | tojson }}")
    out = ChatTemplate(src, "<s>", "</s>").render(MESSAGES[:2])
    assert out == '[2]user:hi,assistant:helloa  |   74{"role": "user", "content": "hi"}'
