"""Which common license a LICENSE file holds, by matching its whole text; anything else is unknown.

A careful matcher for MIT, ISC, BSD-2-Clause, BSD-3-Clause, Apache-2.0 and MPL-2.0 only:

* the text is reduced to lower-case words (punctuation, layout, list markers and ``http``/``https``
  do not matter); copyright lines, ``All rights reserved`` and title lines (``The MIT License``)
  are dropped first, from the templates too;
* each template is the license's full wording, with a few bounded slots where real files put names
  (``IN NO EVENT SHALL <the authors> BE LIABLE``, ``Neither the name of <Google Inc.>``);
* every template found is cut out of the text; the file is identified only if at most a handful of
  words are left over. An added clause, a missing sentence, a changed word or another license
  text makes the result ``None`` (unknown), never a guess.

Used to derive the committed Go module license table (``scripts/go_licenses.py``), not at SBOM time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TEXTS = Path(__file__).with_name("license_texts")
LEFTOVER_WORDS = 150  # at most this many words outside every template (titles, scope notes, holder names)
# A word outside the templates that could change the terms makes the file unknown: a restriction or
# condition, or the name of a license other than the ones found.
RESTRICTIVE = frozenset(
    "not no nor except unless only prohibited prohibit forbidden forbid restrict restricted restriction restrictions "
    "must shall required require requires requirement condition conditions commercial noncommercial evil good "
    "advertising acknowledge acknowledgement acknowledgment attribution terminate termination revoke revocable "
    "patent patents fee fees royalty royalties sell resell pay payment consent liable warranty warranties "
    "disclaimer endorse trademark trademarks military harm".split()
)
OTHER_LICENSE_WORDS = frozenset(
    "gpl lgpl agpl gnu general lesser affero copyleft unicode creative commons cc cc0 public domain json eclipse epl "
    "cddl artistic psf python openssl ssleay zlib boost unlicense wtfpl x11 afl ofl cpl ibm w3c sspl elastic "
    "proprietary confidential".split()
)
_LICENSE_WORDS = {"mit": ("MIT",), "expat": ("MIT",), "apache": ("Apache-2.0",), "isc": ("ISC",),
                  "bsd": ("BSD-2-Clause", "BSD-3-Clause"), "mozilla": ("MPL-2.0",), "mpl": ("MPL-2.0",)}

_COPYRIGHT_LINE = re.compile(
    r"^\s*(?:copyright\s*(?:\(c\)|©|\d{4}|[\[{<]?yyyy|:)|(?:\(c\)|©)\s*\d{4}|all rights reserved)", re.IGNORECASE
)
_COPYRIGHT_NAME_LINE = re.compile(r"^\s*Copyright\s+(?:[A-Z0-9]|the\s+[A-Za-z])")  # "Copyright The Go Authors" (case-sensitive)
_LIST_MARKER = re.compile(r"\(\s*(?:[a-z]|\d{1,2}|[ivx]{1,4})\s*\)", re.IGNORECASE)  # "(a)", "(ii)": layout, not wording
_TITLE_LINE = re.compile(
    r"^\s*(?:the\s+)?(?:mit|isc|expat|(?:new\s+|simplified\s+|modified\s+)?bsd(?:[\s-]*[23][\s-]*clause)?)"
    r"(?:\s+license)?"
    r"(?:\s*\((?:mit|expat|isc|bsd[\s-]*[23][\s-]*clause)\))?\s*:?\s*$",
    re.IGNORECASE,
)
_WORD = re.compile(r"[a-z0-9]+")
_SLOT = re.compile(r"<<(\d+)>>")

MIT = """
Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense,
and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so,
subject to the following conditions:
The above copyright notice and this permission notice shall be included in all copies or substantial
portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT
LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN
NO EVENT SHALL <<8>> BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
DEALINGS IN THE SOFTWARE.
"""

ISC = """
Permission to use, copy, modify, and<<1>> distribute this software for any purpose with or without fee
is hereby granted, provided that the above copyright notice and this permission notice appear in all
copies.
THE SOFTWARE IS PROVIDED "AS IS" AND <<4>> DISCLAIMS ALL WARRANTIES WITH REGARD TO THIS SOFTWARE
INCLUDING ALL IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS. IN NO EVENT SHALL <<4>> BE LIABLE FOR
ANY SPECIAL, DIRECT, INDIRECT, OR CONSEQUENTIAL DAMAGES OR ANY DAMAGES WHATSOEVER RESULTING FROM LOSS OF
USE, DATA OR PROFITS, WHETHER IN AN ACTION OF CONTRACT, NEGLIGENCE OR OTHER TORTIOUS ACTION, ARISING OUT
OF OR IN CONNECTION WITH THE USE OR PERFORMANCE OF THIS SOFTWARE.
"""

_BSD_HEAD = """
Redistribution and use in source and binary forms, with or without modification, are permitted
provided that the following conditions are met:
<<1>> Redistributions of source code must retain the above copyright notice, this list of conditions
and the following disclaimer.
<<1>> Redistributions in binary form must reproduce the above copyright notice, this list of
conditions and the following disclaimer in the documentation and/or other materials provided with the
distribution.
"""
_BSD_CLAUSE3 = """
<<1>> Neither the name of <<12>> nor the names of <<4>> contributors may be used to endorse or promote
products derived from this software without specific prior written permission.
"""
_BSD_TAIL = """
THIS SOFTWARE IS PROVIDED BY <<8>> "AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT
LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL <<8>> BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF
LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING
IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""
BSD_3 = _BSD_HEAD + _BSD_CLAUSE3 + _BSD_TAIL
BSD_2 = _BSD_HEAD + _BSD_TAIL

APACHE_NOTICE = """
Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file except in
compliance with the License. You may obtain a copy of the License at
http://www.apache.org/licenses/LICENSE-2.0
Unless required by applicable law or agreed to in writing, software distributed under the License is
distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or
implied. See the License for the specific language governing permissions and limitations under the
License.
"""


@dataclass(frozen=True)
class Template:
    spdx: str | None  # None: boilerplate that may accompany a license but identifies none by itself
    pattern: re.Pattern[str]


def words(text: str) -> list[str]:
    """The text as lower-case words, copyright and title lines dropped, ``https`` read as ``http``."""
    kept = [line for line in text.splitlines()
            if not _COPYRIGHT_LINE.match(line) and not _COPYRIGHT_NAME_LINE.match(line) and not _TITLE_LINE.match(line)]
    found = _WORD.findall(_LIST_MARKER.sub(" ", "\n".join(kept)).lower())
    # single letters are list markers ("a.", "b)") or the article "a": neither carries the terms
    return ["http" if w == "https" else w for w in found if len(w) > 1 or w.isdigit()]


def _compile(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    for piece in _SLOT.split(template):
        if piece.isdigit():
            parts.append(rf"(?: [a-z0-9]+){{0,{int(piece)}}}")
        else:
            parts.extend(" " + re.escape(w) for w in words(piece))
    return re.compile("".join(parts) + r"(?= |$)")


def _apache_parts() -> tuple[str, str]:
    full = (TEXTS / "Apache-2.0.txt").read_text(encoding="utf-8")
    end = full.index("END OF TERMS AND CONDITIONS")  # some copies stop before it: the rest is optional
    return full[:end], full[end:]


def _mpl_parts() -> tuple[str, str]:
    full = (TEXTS / "MPL-2.0.txt").read_text(encoding="utf-8")
    start = full.index("Exhibit A - Source Code Form License Notice")
    return full[:start], full[start:]


@cache
def templates() -> tuple[Template, ...]:
    apache, apache_appendix = _apache_parts()
    mpl, mpl_exhibits = _mpl_parts()
    # The appendix quotes the notice: cut it before the notice template would see it.
    return (
        Template("Apache-2.0", _compile(apache)),
        Template(None, _compile("END OF TERMS AND CONDITIONS")),
        Template(None, _compile(apache_appendix.replace("END OF TERMS AND CONDITIONS", "", 1))),
        Template("Apache-2.0", _compile(APACHE_NOTICE)),
        Template("MPL-2.0", _compile(mpl)),
        Template(None, _compile(mpl_exhibits)),
        Template("BSD-3-Clause", _compile(BSD_3)),
        Template("BSD-2-Clause", _compile(BSD_2)),
        Template("MIT", _compile(MIT)),
        Template("ISC", _compile(ISC)),
    )


@dataclass(frozen=True)
class Identified:
    spdx: tuple[str, ...]  # the licenses found, sorted; empty when the file is not identified
    leftover: int  # words outside every template
    reason: str = ""  # why the file is not identified

    @property
    def ok(self) -> bool:
        return bool(self.spdx)


def identify(text: str) -> Identified:
    """The SPDX ids whose full texts make up ``text``; anything that could change the terms: none.

    Words outside every template (at most ``LEFTOVER_WORDS``) may only be neutral: a title, a scope
    note ("files under internal/ are licensed under ..."), a project description. One restrictive word
    (``RESTRICTIVE``) or a name of another license makes the whole file unknown.
    """
    body = " " + " ".join(words(text))
    found: set[str] = set()
    for template in templates():
        while True:
            m = template.pattern.search(body)
            if m is None:
                break
            body = body[: m.start()] + body[m.end():]
            if template.spdx:
                found.add(template.spdx)
    rest = body.split()
    if not found:
        return Identified((), len(rest), "no known license text")
    if len(rest) > LEFTOVER_WORDS:
        return Identified((), len(rest), f"{len(rest)} words outside the known texts")
    restrictive = sorted({w for w in rest if w in RESTRICTIVE})
    if restrictive:
        return Identified((), len(rest), f"restrictive words outside the known texts: {', '.join(restrictive)}")
    other = sorted({w for w in rest if w in OTHER_LICENSE_WORDS
                    or (w in _LICENSE_WORDS and not found.intersection(_LICENSE_WORDS[w]))})
    if other:
        return Identified((), len(rest), f"names of other licenses outside the known texts: {', '.join(other)}")
    return Identified(tuple(sorted(found)), len(rest))
