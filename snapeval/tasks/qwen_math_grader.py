"""Qwen2.5-Math's AIME grading (``evaluation/parser.py`` and ``grader.py`` of QwenLM/Qwen2.5-Math),
verdict for verdict: the answer its ``extract_answer`` reads for ``aime24`` (after the last
``boxed``, braced or not, else "the answer is", else the last number), normalized by ``strip_string``
as ``run_execute`` does, then ``math_equal`` against the normalized gold: equal text, equal numbers
(within 1e-4 relative, also read as a percentage), else equal sympy expressions.

Two choices of ours (:data:`DEVIATIONS`, README "Protocols"): LaTeX is parsed by math-verify's
``latex2sympy2_extended`` where the original tries sympy's ANTLR ``parse_latex`` (its antlr4 runtime is
not Hydra's) then ``latex2sympy2``, keeping two of ``parse_latex``'s readings (:func:`_latex`); and
sympy's ``parse_expr`` and ``N`` (which ``eval`` text) see only plain arithmetic (:func:`_plain_math`).
``tests/data/aime_probes.json`` holds the original's verdicts that the tests check.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from collections.abc import Iterator

from latex2sympy2_extended import latex2sympy
from sympy import N, simplify
from sympy.parsing.sympy_parser import parse_expr
from word2number import w2n

# Qwen2.5-Math's unit words, in its order, each a regex (". " matches any character), then with "s".
_UNITS = [
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .",
    "monkey", "prime", "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm",
    "lt", "gain", "ab", "way", "west", "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t",
    "a", "h", "no change", "men", "soldier", "pie", "bc", "excess", "st", "inches", "noon",
    "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq", "mark", "l",
    "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet", "am", "pm",
    "hr", "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm",
    "number", "kmph", "day", "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt",
    "sq inch", "mp", "∏ cm ³", "hectare", "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs",
    "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter", "loss", "yard", "pure", "year",
    "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m", "s .", "metre", "meter",
    "inch",
]  # fmt: skip
UNIT_PATTERNS = [re.compile(r"(^|\W)" + unit + r"($|\W)") for unit in _UNITS + [u + "s" for u in _UNITS]]
_PREFIXES = ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to")
TIMEOUT_S = 3.0  # evaluate.py's ProcessPool(...).map(math_equal_process, params, timeout=3)
_PLAIN_NAMES = frozenset({"sqrt", "pi", "exp", "log", "sin", "cos", "tan", "E", "I", "oo"})
DEVIATIONS = ("qwen_math_latex_parser", "qwen_math_plain_eval")  # README "Protocols", under any preset
# sympy's LaTeX grammar skips spacing (the digits around it join: 7\,3 is 73) and reads formatting
# commands that latex2sympy2_extended drops as a symbol's name (\textbf{73} is no number).
_SKIPPED = re.compile(r"\\(?:[,:;!]|(?:neg)?(?:thin|med|thick)space|q?quad(?![a-zA-Z]))")
_SYMBOLS = re.compile(r"\\(?:text(?:bf|it|rm|normal)|math(?:rm|it)|displaystyle|boxed|fbox)(?![a-zA-Z])")


def score(output: str, gold: str, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether Qwen2.5-Math's evaluation counts ``output`` right for the AIME answer ``gold``: a
    comparison still running after ``timeout_s`` is wrong, as its evaluation's process pool decides
    (the limit needs the main thread's SIGALRM; elsewhere there is none)."""
    prediction, reference = strip_string(extract_answer(output)), strip_string(gold)
    if threading.current_thread() is not threading.main_thread():
        return math_equal(prediction, reference)
    try:
        with _time_limit(timeout_s):
            return math_equal(prediction, reference)
    except _TimeUp:
        return False


class _TimeUp(BaseException):  # not an Exception: the grader's own handlers must not catch it
    """The comparison ran out of time."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def time_up(signum: int, frame: object) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def extract_answer(text: str) -> str:
    """What ``extract_answer(text, "aime24")`` reads, normalized."""
    text = text.replace("\u043a\u0438", "")
    if "final answer is $" in text and "$. I hope" in text:
        pred = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        tail = text.split("boxed")[-1]
        if not tail:
            return ""
        pred = _braced(tail[1:]) if tail[0] == "{" else tail.split("$")[0].strip()
    elif "he answer is" in text:
        pred = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        pred = text.split("final answer is")[-1].strip()
    elif "答案是" in text:
        pred = text.split("答案是")[1].strip().split("\n\n")[0].strip()
    else:
        numbers = re.findall(r"-?\d*\.?\d+", text.replace(",", ""))
        pred = numbers[-1] if numbers else ""
    pred = re.sub(r"\n\s*", "", pred)
    return strip_string(pred.removeprefix(":").removesuffix(".").removesuffix("/"))


def _braced(text: str) -> str:
    """The text up to the brace closing an opened one (all of it when none closes)."""
    depth = 1
    for index, char in enumerate(text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[:index]
    return text


def strip_string(value: object) -> str:
    """Qwen2.5-Math's ``strip_string`` (units removed)."""
    s = str(value).strip().replace("\n", "").rstrip(".").replace("\\!", "")
    s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
    s = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", s).replace("bmatrix", "pmatrix")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    unitless = re.sub(r"\\text\{.*?\}$", "", s).strip()
    if unitless and unitless != s:
        s = unitless
    for _ in range(2):
        for pattern in UNIT_PATTERNS:
            s = pattern.sub(r"\1\2", s) or s
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "").replace("$", "")
    s = _word_number(s.replace("\\(", "").replace("\\)", ""))
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for prefix in _PREFIXES:
        s = s.replace(prefix, "")
    s = s.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    s = s.replace("\\%", "").replace("%", "").replace(" .", " 0.").replace("{.", "{0.")
    s = s.replace("infinity", "\\infty")
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    s = re.sub(r"\\mbox\{.*?\}", "", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    s = re.sub(r"(\d+)\.0*$", r"\1", re.sub(r"(\d+)\.0*([^\d])", r"\1\2", s))
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s).replace(" ", "")
    return _fix_a_slash_b(_fix_fracs(s))


def _word_number(text: str) -> str:
    try:
        return str(w2n.word_to_num(text))
    except Exception:  # word2number raises ValueError and, on odd input, IndexError and others
        return text


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``."""
    first, *rest = s.split("\\frac")
    fixed = first
    for part in rest:
        fixed += "\\frac"
        if part[:1] == "{":
            fixed += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            fixed += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            fixed += "{" + part[0] + "}" + part[1:]
    return fixed


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` for integers (or a sqrt) on both sides."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a = parts[0] if "sqrt" in parts[0] else int(parts[0])
        b = parts[1] if "sqrt" in parts[1] else int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _parse_digits(text: str) -> float | None:
    text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        if text.endswith("%"):
            text = text[:-1].removesuffix("\\")
            try:
                return float(text) / 100
            except ValueError:
                return None
    return None


def _choice(pred: str) -> str:
    pred = pred.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", pred.upper())
    return (letters[-1] if letters else pred.strip().strip(".")).rstrip(".").rstrip("/")


def math_equal(prediction: str, reference: str) -> bool:
    """Qwen2.5-Math's ``math_equal`` (percentages and relative closeness on)."""
    if prediction.strip().lower() == reference.strip().lower():
        return True
    if reference in ("A", "B", "C", "D", "E") and _choice(prediction) == reference:
        return True
    pred_number, ref_number = _parse_digits(prediction), _parse_digits(reference)
    if pred_number is not None and ref_number is not None:
        return any(
            math.isclose(item, pred_number, rel_tol=1e-4)
            for item in (ref_number / 100, ref_number, ref_number * 100)
        )
    if not prediction:
        return False
    reference, prediction = reference.strip(), prediction.strip()
    if "pmatrix" in prediction and "pmatrix" not in reference:
        reference = ", ".join(
            r"\begin{pmatrix}" + m.strip("{}").replace(",", "\\") + r"\end{pmatrix}"
            for m in re.findall(r"\{.*,.*\}", reference)
        )
    if _bracket_free(prediction, reference):
        return True
    if re.match(r"(\(|\[).+(\)|\])", prediction) and re.match(r"(\(|\[).+(\)|\])", reference):
        pred_parts, ref_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and all(map(math_equal, pred_parts, ref_parts)):
            return True
    if _matrix_equal(prediction, reference):
        return True
    if prediction.count("=") == 1 and reference.count("=") == 1:
        pred, ref = (_difference(side) for side in (prediction, reference))
        if symbolic_equal(pred, ref) or symbolic_equal(f"-({pred})", ref):
            return True
    if _one_side(prediction, reference) and math_equal(prediction.split("=")[1], reference):
        return True  # the three equation cases exclude each other
    if _one_side(reference, prediction) and math_equal(prediction, reference.split("=")[1]):
        return True
    return symbolic_equal(prediction, reference)


def _one_side(equation: str, other: str) -> bool:
    """``equation`` is ``x = ...`` (a name of at most two characters) and ``other`` no equation."""
    return equation.count("=") == 1 and len(equation.split("=")[0].strip()) <= 2 and "=" not in other


def _bracket_free(prediction: str, reference: str) -> bool:
    """Equal once enclosing brackets and all braces and parentheses are dropped (case ignored)."""
    pred, ref = prediction, reference
    if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        pred, ref = pred.strip("[]()"), ref.strip("[]()")
    for char in "{}()":
        pred, ref = pred.replace(char, ""), ref.replace(char, "")
    return pred.lower() == ref.lower()


def _matrix_equal(prediction: str, reference: str) -> bool:
    begins, ends = ("\\begin{pmatrix}", "\\begin{bmatrix}"), ("\\end{pmatrix}", "\\end{bmatrix}")
    if not all(text.startswith(begins) and text.endswith(ends) for text in (prediction, reference)):
        return False

    def rows(text: str) -> list[list[str]]:
        body = text[len(begins[0]) : -len(ends[0])].split("\\\\")
        return [line.strip().split("&") for line in body if line.strip()]

    pred_rows, ref_rows = rows(prediction), rows(reference)
    return len(pred_rows) == len(ref_rows) and all(
        len(p) == len(r) and all(map(math_equal, p, r)) for p, r in zip(pred_rows, ref_rows, strict=True)
    )


def _difference(equation: str) -> str:
    left, right = equation.split("=")
    return f"{left.strip()} - ({right.strip()})"


def _plain_math(text: str) -> bool:
    """Whether ``text`` is arithmetic that ``parse_expr`` may evaluate: numbers, operators, single-letter
    symbols and a few sympy names (never an attribute, a dunder, a string or another call)."""
    if not re.fullmatch(r"[\w\s+\-*/^().,]*", text) or "__" in text:
        return False
    return all(len(name) == 1 or name in _PLAIN_NAMES for name in re.findall(r"[A-Za-z_]\w*", text))


def _latex(text: str) -> object:
    """``text`` by latex2sympy2_extended, read as ``parse_latex`` reads spacing and formatting commands."""
    if _SYMBOLS.search(text):
        raise ValueError("sympy's parse_latex reads this command as a symbol")
    return latex2sympy(_SKIPPED.sub("", text))


def _parse(text: str) -> object:
    for parser in (_latex, parse_expr):
        for candidate in (text.replace("\\\\", "\\"), text):
            if parser is parse_expr and not _plain_math(candidate):
                continue
            try:
                return parser(candidate)
            except Exception:  # noqa: BLE001 - the parsers raise many types on text they do not take
                continue
    return text


def symbolic_equal(a_text: str, b_text: str) -> bool:
    """Qwen2.5-Math's ``symbolic_equal``: equal as parsed, simplified, equations, numbers, matrices."""
    a, b = _parse(a_text), _parse(b_text)
    checks = (
        lambda: str(a) == str(b) or a == b,
        lambda: a.equals(b) or simplify(a - b) == 0,
        lambda: abs(a.lhs - a.rhs).equals(abs(b.lhs - b.rhs)),
        lambda: math.isclose(_value(b), _value(a), rel_tol=1e-4),
        lambda: a.shape == b.shape and a.applyfunc(_round3).equals(b.applyfunc(_round3)),
    )
    for check in checks:
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001 - each check applies to some kinds of expression only
            continue
    return False


def _value(x: object) -> float:
    """The number ``N`` evaluates ``x`` to (``N`` sympifies a string, which runs ``eval``: plain
    arithmetic only)."""
    if isinstance(x, str) and not _plain_math(x):
        raise ValueError(f"not plain arithmetic: {x!r}")
    return float(N(x))


def _round3(x: object) -> object:
    return round(x, 3)
