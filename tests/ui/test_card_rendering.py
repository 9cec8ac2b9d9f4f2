"""Model cards render in time linear in their length (issue 33 §3): a tenant's 48 kB card of
`"**a " * 12000` froze the old renderer (its inline matcher was about cubic). Here 1 MiB cards of
every adversarial shape render in real Chromium within a second each, the renderer still makes
the markup it should, and text still never becomes markup.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Server, publish

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser

MIB = 1024 * 1024
# Units repeated to 1 MiB: openers that never close, closers that never open, brackets without a
# close, links without a tail, backticks, underscores, nesting, autolinks without `>`, and the
# block patterns (headings, tables, quotes) that could backtrack over a long line.
SHAPES = {
    "strong openers": "**a ",
    "strong closers": "a** ",
    "strong pairs": "**a** ",
    "em openers": "*a ",
    "brackets": "[",
    "bracket pairs without a tail": "[a]",
    "link tails without a close": "[a](x",
    "images": "![",
    "backticks": "`",
    "underscores": "_",
    "underscore words": "_a ",
    "mixed": "_a *b [c](`d ",
    "autolinks without a close": "<https://x",
    "stars": "*",
    "one line per opener": "**a\n",
    "quotes": ">",
}
ONE_LINERS = {
    "a heading of spaces": "# " + " " * MIB + "x",
    "a heading of hashes": "# a" + "#" * MIB + "x",
    "a table rule of spaces": "a|b\n|-" + " " * MIB + "x",
    "nested strong": "*" * (MIB // 2) + "a" + "*" * (MIB // 2),
    "deep nesting": "**a " * (MIB // 8) + "b** " * (MIB // 8),
    "a title never closed": "[a](x " + " " * MIB,
}

RENDER_TIMED = """async (cases) => {
  const { renderMarkdown } = await import('/ui/js/markdown.js');
  const times = {};
  for (const [name, unit, size] of cases) {
    // "x " first: a card that starts with ``` or > is one code block or quote, not this shape.
    const text = size ? "x " + unit.repeat(Math.ceil(size / unit.length)).slice(0, size) : unit;
    const box = document.createElement('article');
    document.body.append(box);
    const start = performance.now();
    box.append(...renderMarkdown(text));
    box.getBoundingClientRect();  // layout included
    const ms = performance.now() - start;
    times[name] = { ms, chars: text.length, shown: box.textContent.length };
    box.remove();
  }
  return times;
}"""


def test_one_mib_adversarial_cards_render_within_a_second(signed_in: Page) -> None:
    """Each shape within a second. This machine may be shared and loaded: the bound is then
    stretched to four times what a plain 1 MiB card of prose takes on the same page just
    before (layout alone is most of that; the old renderer took minutes on 48 kB, so a
    super-linear one still fails by orders of magnitude). Load comes and goes (other test
    processes share the cores), so a shape over the bound is timed again, with prose again
    beside it, up to twice: it passes if one round is within that round's bound."""
    prose = ["prose", "Lorem ipsum dolor sit amet, consectetur. ", MIB]
    cases = [[name, unit, MIB] for name, unit in SHAPES.items()]
    cases += [[name, text, 0] for name, text in ONE_LINERS.items()]
    first: dict[str, dict] = {}
    slow: dict[str, str] = {}
    for _ in range(3):
        times = signed_in.evaluate(RENDER_TIMED, [prose, *cases])
        ms = times.pop("prose")["ms"]
        bound = max(1000.0, 4 * ms)
        print(
            f"prose {ms:.0f} ms, bound {bound:.0f} ms:",
            {n: round(t["ms"]) for n, t in times.items()},
        )
        first = first or times
        slow = {
            n: f"{t['ms']:.0f} ms (bound {bound:.0f})" for n, t in times.items() if t["ms"] >= bound
        }
        cases = [case for case in cases if case[0] in slow]
        if not slow:
            break
    assert not slow, f"cards over the bound in three rounds: {slow}"
    for name, t in first.items():
        assert t["chars"] >= MIB, name
        # Nothing is dropped: what is not markup is shown as text (a heading's spaces aside).
        if name in SHAPES:
            assert t["shown"] > MIB // 3, (name, t)


INLINE = """async (cases) => {
  const { renderMarkdown } = await import('/ui/js/markdown.js');
  return cases.map((text) => {
    const box = document.createElement('div');
    box.append(...renderMarkdown(text));
    return box.innerHTML;
  });
}"""

EXPECTED = {
    "a **b** c": "<p>a <strong>b</strong> c</p>",
    "*em* and __strong__": "<p><em>em</em> and <strong>strong</strong></p>",
    "**bold *it* x**": "<p><strong>bold <em>it</em> x</strong></p>",
    "snake_case_name stays": "<p>snake_case_name stays</p>",
    "`co*de*` *x*": "<p><code>co*de*</code> <em>x</em></p>",
    "a * b * c and **a **b": "<p>a * b * c and **a **b</p>",
    "[text *em*](https://example.com/a)": (
        '<p><a href="https://example.com/a" rel="noopener noreferrer nofollow" '
        'referrerpolicy="no-referrer">text <em>em</em></a></p>'
    ),
    '[t](https://example.com "title")': (
        '<p><a href="https://example.com" rel="noopener noreferrer nofollow" '
        'referrerpolicy="no-referrer">t</a></p>'
    ),
    "![alt](pic.png) <https://example.com/x>": (
        '<p><span class="md-image">[image: alt]</span> '
        '<a href="https://example.com/x" rel="noopener noreferrer nofollow">'
        "https://example.com/x</a></p>"
    ),
    "[x](javascript:alert(1))": "<p><span>x</span>)</p>",
    "**<b>x</b>**": "<p><strong>&lt;b&gt;x&lt;/b&gt;</strong></p>",
    "[[[a](b) `x": "<p><span>[[a</span> `x</p>",
    "# Title ##": '<h3 class="md-heading">Title</h3>',
    "> > quoted": "<blockquote><blockquote><p>quoted</p></blockquote></blockquote>",
}


def test_the_renderer_still_makes_the_markup_it_should(signed_in: Page) -> None:
    got = signed_in.evaluate(INLINE, list(EXPECTED))
    assert dict(zip(EXPECTED, got, strict=True)) == EXPECTED


def test_a_one_mib_hostile_card_shows_on_the_model_page(
    signed_in: Page, ui_server: Server, tmp_path: Path
) -> None:
    """The card the issue found, at the largest size the page renders, through the real page."""
    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path / "tiny")
    card = ("**a " * (MIB // 4))[: MIB - 16]
    (directory / "README.md").write_text(card)
    name = f"acme/card-{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": name}).json()
    publish(api, model["id"], directory, finalize=True)
    signed_in.goto(f"/#/models/{model['id']}")
    article = signed_in.get_by_role("article", name="Model card")
    article.wait_for(timeout=20_000)
    shown = article.evaluate("(el) => el.textContent.length")
    assert shown == len(card.strip())  # a paragraph's edges are trimmed
