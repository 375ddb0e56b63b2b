"""Is a request in English? A cheap heuristic, good enough for a share over thousands of requests.

Two votes, on the user text with fenced code blocks removed (code is English-ish everywhere):
1. script: when more than 30% of the letters are outside the Latin alphabets (CJK, Cyrillic,
   Arabic, Devanagari, ...), the text is not English;
2. stopwords: otherwise the common function words of English, Spanish, French, German,
   Portuguese and Italian are counted; another language with more of them than English wins.
Text with no stopwords at all (a bare code line, a number) counts as English.
"""

from __future__ import annotations

import re

METHOD = ("script (over 30% non-Latin letters) or stopword vote (en/es/fr/de/pt/it) "
          "on the user text without code fences")

_FENCED = re.compile(r"```.*?(?:```|$)", re.S)
_WORD = re.compile(r"[^\W\d_]+")
_SAMPLE_CHARS = 2000
_NON_LATIN_SHARE = 0.3

_STOPWORDS = {
    "en": "the and is are to of in that it for you with this on be what how can my do not have was an or me your "
          "please from as at by if about why which there would should i",
    "es": "de la en un el los las del que y es por para con una se lo como más pero mi qué cómo puedo está son al también",
    "fr": "de la en un le les des du et est une qui dans pour pas sur avec ce je vous il au sont mais comment pourquoi",
    "de": "der die das und ist nicht ein eine zu mit den dem ich sie es auf für wie von im auch was wir",
    "pt": "de os um uma para com não em do da no na por como mais você está são ao também isso",
    "it": "la un il di che è per non con della sono mi come ma ho gli anche perché questo",
}
_LANGS_OF: dict[str, tuple[str, ...]] = {}
for _lang, _words in _STOPWORDS.items():
    for _w in _words.split():
        _LANGS_OF[_w] = (*_LANGS_OF.get(_w, ()), _lang)
_LETTER = re.compile(r"[^\W\d_]")
_NON_LATIN_LETTER = re.compile(r"[^\W\d_\x00-\u024f]")


def is_english(text: str) -> bool:
    """Return whether the text reads as English (see the module's heuristic)."""
    text = _FENCED.sub(" ", text)[:_SAMPLE_CHARS] if "```" in text else text[:_SAMPLE_CHARS]
    if not text.isascii():
        non_latin = len(_NON_LATIN_LETTER.findall(text))
        if non_latin and non_latin > _NON_LATIN_SHARE * len(_LETTER.findall(text)):
            return False
    counts = dict.fromkeys(_STOPWORDS, 0)
    for word in _WORD.findall(text.lower()):
        for lang in _LANGS_OF.get(word, ()):
            counts[lang] += 1
    english = counts.pop("en")
    return english >= max(counts.values())
