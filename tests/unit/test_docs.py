"""The README is the settings reference: it must list every setting with its real default."""

from __future__ import annotations

import re
from pathlib import Path

from hutch.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_rows() -> dict[str, str]:
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\|\s*`(HUTCH_[A-Z_]+)`\s*\|\s*([^|]+?)\s*\|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip("`")
    return rows


def _shown(value: object) -> str:
    if value is None:
        return "(unset)"
    if value == ():
        return "(empty)"
    if isinstance(value, tuple):
        return ",".join(f"{item:g}" for item in value)
    return str(value)


def test_readme_opens_with_the_two_quick_start_commands() -> None:
    text = README.read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_lists_every_setting_with_its_default() -> None:
    rows = _readme_rows()
    for name, field in Settings.model_fields.items():
        variable = f"HUTCH_{name.upper()}"
        assert variable in rows, f"{variable} is missing from the README's settings table"
        assert rows[variable] == _shown(field.default), variable


def test_readme_lists_no_setting_that_does_not_exist() -> None:
    known = {f"HUTCH_{name.upper()}" for name in Settings.model_fields}
    assert set(_readme_rows()) <= known


def test_the_readme_spec_example_is_a_spec_that_loads() -> None:
    import textwrap

    from hutch.services.parser.spec import spec_from_bytes

    text = README.read_text(encoding="utf-8")
    block = text.split("- A spec is YAML; without one")[1].split("```yaml")[1].split("```")[0]
    spec = spec_from_bytes(textwrap.dedent(block).encode(), "README.md")
    assert {rule.kind for rule in spec.fields.values()} == {"css", "xpath", "jmespath"}
    assert any(rule.re for rule in spec.fields.values()) and spec.item


def test_the_readme_crawl_example_is_a_spec_that_loads() -> None:
    import textwrap

    from hutch.services.parser.spec import spec_from_bytes

    text = README.read_text(encoding="utf-8")
    block = text.split("- A spec with `follow:` makes the job a **crawl**")[1].split("```yaml")[1].split("```")[0]
    spec = spec_from_bytes(textwrap.dedent(block).encode(), "README.md")
    (rule,) = spec.follow
    assert (rule.allow, rule.deny, rule.same_domain) == ([r"\.html$"], ["/print/"], True)
    assert (spec.max_depth, spec.max_pages) == (2, 100_000)
