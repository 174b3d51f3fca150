"""Rules read off the source tree, so a later change cannot quietly break them:

- XML is parsed with defusedxml only: no parsing entry point of xml.etree, xml.dom, xml.sax,
  xml.parsers.expat or lxml is imported (building an Element or catching ParseError is fine).
- Secrets are compared in constant time: no `==` / `!=` between values named like a token,
  secret, password or credential (hmac.compare_digest instead).
- Nothing is marked safe: no `|safe`, `|safeseq`, `{% autoescape off %}` or `mark_safe()`, and
  `format_html()` always gets a constant format (an f-string or `%`/`.format()` there would
  put unescaped text in the page).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fleet", "telemetry", "sizing", "dashboard", "config")


def sources() -> list[Path]:
    """Product modules: the packages' .py files, tests and migrations left out."""
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if "tests" not in path.parts and "migrations" not in path.parts
    )


def templates() -> list[Path]:
    return sorted(p for base in (ROOT / "templates", *(ROOT / pkg / "templates" for pkg in PACKAGES))
                  if base.is_dir() for p in base.rglob("*.html"))


# Stdlib and lxml modules that parse XML, and, for xml.etree.ElementTree, the names that parse.
PARSING_MODULES = ("xml.dom", "xml.sax", "xml.parsers", "lxml", "xml.etree.cElementTree")
ELEMENT_TREE_PARSERS = {"fromstring", "fromstringlist", "parse", "iterparse", "XML", "XMLID", "XMLParser",
                        "XMLPullParser", "ElementTree"}


def xml_violations(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PARSING_MODULES) or alias.name.startswith("xml.etree"):
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if module.startswith(PARSING_MODULES) or (module == "xml" and any(
                    a.name in {"dom", "sax", "parsers", "etree"} for a in node.names)):
                found.append(f"from {module} import ...")
            elif module == "xml.etree":
                found.append("from xml.etree import ...")
            elif module == "xml.etree.ElementTree":
                found += [f"from {module} import {a.name}" for a in node.names if a.name in ELEMENT_TREE_PARSERS]
    return found


def test_xml_is_parsed_with_defusedxml_only():
    bad = {str(path.relative_to(ROOT)): found for path in sources()
           if (found := xml_violations(ast.parse(path.read_text())))}
    assert not bad, f"parse XML with defusedxml (defusedxml.ElementTree.fromstring), not: {bad}"


def test_the_xml_rule_catches_what_it_must():
    """The check itself: each way of reaching a stdlib or lxml parser is caught."""
    caught = [
        "import xml.etree.ElementTree as ET", "from xml.etree.ElementTree import fromstring",
        "from xml.etree import ElementTree", "from xml.dom import minidom", "import xml.dom.minidom",
        "from xml import sax", "import xml.sax", "from xml.parsers import expat", "from lxml import etree",
        "import lxml.etree",
    ]
    for line in caught:
        assert xml_violations(ast.parse(line)), line
    for line in ("from xml.etree.ElementTree import Element, ParseError", "from defusedxml.ElementTree import parse"):
        assert not xml_violations(ast.parse(line)), line


# Digests of non-secret data (evidence_key, layout keys) are compared freely; these are secrets.
SECRET_NAME = re.compile(r"token|secret|password|passwd|api_key|credential", re.IGNORECASE)


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return ""


def plain_secret_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a secret-named value with == or != (not against None, "" or a type check)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(o, ast.Constant) for o in operands):  # `token == ""`, `x is None`-like checks
            continue
        if any(SECRET_NAME.search(_name(o)) for o in operands):
            lines.append(node.lineno)
    return lines


def test_secrets_are_compared_in_constant_time():
    bad = {str(path.relative_to(ROOT)): lines for path in sources()
           if (lines := plain_secret_comparisons(ast.parse(path.read_text())))}
    assert not bad, f"compare secrets with hmac.compare_digest, not == / !=: {bad}"


def test_the_comparison_rule_catches_what_it_must():
    for line in ("ok = presented == agent.token", "ok = token != expected", "ok = bearer_token(request) == stored",
                 "ok = request.headers['x'] == settings.METRICS_TOKEN"):
        assert plain_secret_comparisons(ast.parse(line)), line
    for line in ("ok = token == ''", "ok = hmac.compare_digest(token, expected)", "ok = kind == other_kind"):
        assert not plain_secret_comparisons(ast.parse(line)), line


TEMPLATE_ESCAPES = re.compile(r"\|\s*safe(seq)?\b|{%\s*autoescape\s+off\s*%}")


def test_templates_mark_nothing_safe():
    bad = {str(p.relative_to(ROOT)): TEMPLATE_ESCAPES.findall(p.read_text()) for p in templates()
           if TEMPLATE_ESCAPES.search(p.read_text())}
    assert not bad, f"templates must not switch escaping off: {bad}"


def unsafe_markup_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name in {"mark_safe", "SafeString", "SafeText"}:
            found.append(f"{name}() on line {node.lineno}")
        elif name == "format_html" and node.args:
            fmt = node.args[0]
            built = isinstance(fmt, ast.JoinedStr) or (isinstance(fmt, ast.BinOp) and isinstance(fmt.op, ast.Mod)) \
                or (isinstance(fmt, ast.Call) and _name(fmt.func) == "format")
            if built:
                found.append(f"format_html() with a built format on line {node.lineno}")
    return found


def test_python_marks_nothing_safe():
    bad = {str(path.relative_to(ROOT)): found for path in sources()
           if (found := unsafe_markup_calls(ast.parse(path.read_text())))}
    assert not bad, f"escape with format_html and a constant format instead: {bad}"


def test_the_markup_rule_catches_what_it_must():
    for line in ("mark_safe(name)", "format_html(f'<b>{name}</b>')", "format_html('<b>%s</b>' % name)",
                 "format_html('<b>{}</b>'.format(name))"):
        assert unsafe_markup_calls(ast.parse(line)), line
    assert not unsafe_markup_calls(ast.parse("format_html('<b>{}</b>', name)"))
    assert TEMPLATE_ESCAPES.search("{{ vm.name|safe }}")
    assert TEMPLATE_ESCAPES.search("{% autoescape off %}")
    assert not TEMPLATE_ESCAPES.search("{{ vm.name|safeish_filter }}")
