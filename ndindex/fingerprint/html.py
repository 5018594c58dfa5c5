"""HTML to visible text.

selectolax (Lexbor, a maintained C HTML5 parser) is used when installed
(``pip install 'ndindex[html]'``); it is 10-30x faster than the standard
library's ``html.parser``, which serves as the fallback so that HTML input
never needs an optional package.  Both drop tags, comments, ``<script>``,
``<style>``, ``<noscript>`` and ``<template>`` content, decode entities and
separate block elements by a line break.  Their outputs may differ in white
space only; the word tokens agree on well-formed documents.
"""

from __future__ import annotations

from html.parser import HTMLParser

#: Elements whose content is never visible text.
INVISIBLE_TAGS = ("script", "style", "noscript", "template", "head")

_BLOCK_TAGS = frozenset(
    "address article aside blockquote br dd div dl dt fieldset figcaption figure footer "
    "form h1 h2 h3 h4 h5 h6 header hr li main nav ol p pre section table td th tr ul "
    "title".split())


def _selectolax():
    try:
        from selectolax.lexbor import LexborHTMLParser
    except ImportError:
        try:
            from selectolax.parser import HTMLParser as LexborHTMLParser
        except ImportError:
            return None
    return LexborHTMLParser


class _TextCollector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in INVISIBLE_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in INVISIBLE_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(html: str | bytes, *, parser: str = "auto") -> str:
    """Return the visible text of an HTML document.

    Args:
        html: the document; bytes are decoded as UTF-8 with replacement.
        parser: ``"auto"`` (selectolax if installed, else the standard
            library), ``"selectolax"`` or ``"stdlib"``.

    Raises:
        ImportError: ``parser="selectolax"`` without the ``html`` extra.
        ValueError: an unknown parser name.
        TypeError: ``html`` is neither str nor bytes.
    """
    if isinstance(html, (bytes, bytearray, memoryview)):
        html = bytes(html).decode("utf-8", errors="replace")
    if not isinstance(html, str):
        raise TypeError(f"html must be str or bytes, got {type(html).__name__}")
    if parser not in ("auto", "selectolax", "stdlib"):
        raise ValueError(f"parser must be 'auto', 'selectolax' or 'stdlib', got {parser!r}")
    fast = _selectolax() if parser != "stdlib" else None
    if parser == "selectolax" and fast is None:
        raise ImportError("parser='selectolax' needs the html extra: pip install 'ndindex[html]'")
    if fast is None:
        collector = _TextCollector()
        collector.feed(html)
        collector.close()
        return "".join(collector.parts)
    tree = fast(html)
    for node in tree.css(",".join(INVISIBLE_TAGS)):
        node.decompose()
    root = tree.body if tree.body is not None else tree.root
    if root is None:
        return ""
    return root.text(separator="\n", strip=False)
