"""Every setting of the typed config, documented: `setting_docs` reads each field's comment from
the config's source, `documented_toml` is what `trident config` prints (and the docs site's
configuration page)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from service.config import _SECTIONS, Config, _Rule, _toml_value


@dataclass(frozen=True)
class SettingDoc:
    """One setting as `trident config` lists it: its default, what it allows and its doc (the
    comment beside the field, or the comment lines just above it)."""

    section: str
    key: str
    type: str
    default: Any
    allowed: str  # "" where any value of the type is
    help: str


def _field_comments(cls: type) -> dict[str, str]:
    """Each field of `cls` -> its comment in the source: the one on its line, else the block
    of comment lines directly above it; {} where the source cannot be read (a frozen app)."""
    import ast
    import inspect
    import io
    import textwrap
    import tokenize

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whole line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip().removesuffix("fmt: skip").strip()
            comments[token.start[0]] = (text, token.line[: token.start[1]].strip() == "")
    lines = source.splitlines()
    docs = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        line = node.lineno
        text, whole = comments.get(node.end_lineno or line, ("", True))
        if not text or whole:
            above = []
            while line - 1 in comments and comments[line - 1][1] and lines[line - 2].strip():
                line -= 1
                above.insert(0, comments[line][0])
            text = " ".join(above)
        docs[node.target.id] = text
    return docs


def setting_docs() -> list[SettingDoc]:
    """Every setting of every section, in the order the config declares them."""
    docs = []
    for section, cls in _SECTIONS.items():
        comments = _field_comments(cls)
        for f in fields(cls):
            rule: _Rule | None = f.metadata.get("rule")
            allowed = rule.describe() if rule is not None else ""
            typ = f.type if isinstance(f.type, str) else f.type.__name__
            docs.append(SettingDoc(section, f.name, typ, f.default, allowed,
                                   comments.get(f.name, "")))  # fmt: skip
    return docs


def documented_toml(cfg: Config | None = None, width: int = 100) -> str:
    """Every setting as TOML, each under its doc and what it allows, wrapped to `width`: the
    defaults, or `cfg`'s values with the default beside each that differs. server.auth_token
    is never shown (a secret): set, it stays commented out."""
    import textwrap

    current = (cfg or Config()).to_dict()
    lines = [
        "# Every Trident setting with its doc, in TOML as --config FILE reads it. Layered:",
        "# defaults < --config FILE < TRIDENT_<SECTION>__<KEY> < --set section.key=value.",
    ]
    section = ""
    for doc in setting_docs():
        if doc.section != section:
            section = doc.section
            what = (_SECTIONS[section].__doc__ or "").strip().splitlines()[0]
            lines += ["", f"[{section}]  # {what}"]
        about = doc.help + (f" ({doc.type}, {doc.allowed})" if doc.allowed else f" ({doc.type})")
        lines += textwrap.wrap(about, width, initial_indent="# ", subsequent_indent="# ")
        value = current[section][doc.key]
        if section == "server" and doc.key == "auth_token" and value:
            lines.append("# auth_token = (set; not shown)")
            continue
        entry = f"{doc.key} = {_toml_value(value)}"
        if value != doc.default:
            entry += f"  # default: {_toml_value(doc.default)}"
        lines.append(entry)
    return "\n".join(lines) + "\n"
