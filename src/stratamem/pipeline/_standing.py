"""Standing instructions and preferences, recognised in a sentence of the user's by rules.

A standing item holds for later requests that do not name it: "Always give me a code
example when I ask about async error handling", "I prefer asynchronous persistence with
acknowledgements", "I'm vegetarian" (docs/recall.md#standing-instructions). The offline
write path (``_heuristics``) asks ``standing`` about each sentence it keeps; the LLM
extraction prompt asks the model the same question. Pure and deterministic.

What counts (English; Chinese where cheap), read on the sentence as the user said it (first
person, discourse markers stripped, questions already dropped):

- an **instruction** (kind ``instruction``): an imperative that starts with always / never
  ("Always use 24-hour time when I ask about meeting schedules"), a negative one
  ("Please don't suggest steak houses"; not "don't worry", "don't forget": those are about
  this moment), an imperative that says it lasts ("Answer in French from now on", "Use
  metric units whenever I ask about recipes", "Keep answers short": answers, plural), or a
  wish turned to the assistant that lasts ("I want you to always cite sources", "When
  asking about profiling results, I always want to see a latency graph"); Chinese 请不要 /
  以后请 ... / 每次都 ...;
- a **preference** stated as one (kind ``preference``): "I prefer X (over Y)", "I'd rather
  X", "I've set a preference for X", "my preference is X"; Chinese 我更喜欢 / 我偏好 /
  我倾向于 / 我宁愿. Not "I preferred" (a past judgement), not someone else's ("my boss
  prefers"), not "I like X" (a taste, kept as an ordinary preference fact);
- a lasting **diet or health constraint** (kind ``constraint``, applying to everything):
  "I'm vegetarian", "I'm allergic to peanuts", "I don't eat pork", "I keep kosher";
  Chinese 我吃素 / 我是素食者 / 我对花生过敏 / 我不吃猪肉.

Not standing: habits and reports ("I always forget my keys", "I've never used Redis"),
plans ("I'll always include the seed"), relayed rules ("I've been told to always use
camelCase"), third-person statements, questions.

The **scope** is what the item applies to: the subject of "when I ask about X" / "for
questions about X" / "when it comes to X" (当我问到X的时候); for a preference without one,
what is preferred ("Redis pub/sub over in-memory event emitters for real-time sync"); None
for an instruction without one ("Keep answers short") and for a diet or health constraint:
those apply to every request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_SCOPE_WORDS", "Standing", "standing"]

_I = re.IGNORECASE
MAX_SCOPE_WORDS = 16


@dataclass(frozen=True)
class Standing:
    """What ``standing`` recognised: the fact kind, and the scope (None: everything)."""

    kind: str  # "instruction", "preference" or "constraint"
    scope: str | None


# "when I ask about X", "whenever I ask you about X", "when asking about X", "for questions
# about X", "when it comes to X", "if I ask for X": the scope is X.
_SCOPE = re.compile(
    r"\b(?:(?:when|whenever|if|each\s+time|every\s+time|any\s*time|before|after)\s+"
    r"(?:i\s+|i['’]m\s+)?"
    r"(?:ask|asking|talk|talking|inquire|inquiring|enquire|question|chat|chatting|write"
    r"|writing)\s+(?:you\s+|me\s+)?(?:about|for|regarding|on|into)"
    r"|(?:for|in|with)\s+(?:any\s+|all\s+|my\s+)?(?:questions?|requests?|queries|anything)"
    r"\s+(?:about|on|regarding|related\s+to|involving)"
    r"|when(?:ever)?\s+it\s+comes\s+to|when(?:ever)?\s+(?:we|i)\s+(?:discuss|cover)"
    r"|when\s+discussing)\s+(?P<scope>[^.!?;]+)",
    _I,
)
# A scope ends at the clause that follows it ("..., so please ...", "... and I want ...").
_SCOPE_END = re.compile(
    r"\s*(?:[,;:(]|\s-\s|\s(?:so|but|because|since|as|and\s+i|and\s+please|then|unless"
    r"|please)\s).*$",
    _I,
)
# Says it lasts: a scope, or one of these.
_LASTING = re.compile(
    r"\b(?:from\s+now\s+on|going\s+forward|in\s+(?:the\s+)?future|from\s+here\s+on"
    r"|always|every\s+time|each\s+time|whenever|by\s+default"
    r"|(?:your|all|the|my)\s+(?:answers|responses|replies|explanations)"
    r"|answers|responses|replies)\b",
    _I,
)
_PLEASE = r"(?:please\s+|pls\s+|kindly\s+)?"
# "Always use ...", "Never book ...": always / never and a verb (not "Always a pleasure").
_ALWAYS_NEVER = re.compile(rf"^{_PLEASE}(?:always|never)\s+(?P<verb>[a-z]+)", _I)
# Words after always / never that are no verb in the imperative: "Always a pleasure",
# "Never saw this coming", "Always up for something sweet", "Always running around".
_NOT_IMPERATIVE = frozenset(
    """here there a an the so such been good great fun easy again ever mind forget up down
    on in at out too my your our his her their its with for to happy ready nice welcome
    glad sure late early busy thankful grateful saw said was were had did went got came
    made thought knew told felt gave took ran seen done gone""".split()  # noqa: SIM905
)
# Sayings and encouragement, not instructions: "Never say never", "Don't limit yourself".
_SAYING = re.compile(r"^never\s+say\s+never\b|\b(?:yourself|yourselves)\b", _I)
# "Don't suggest steak houses", "Avoid jargon", "Stop using emojis".
_NEGATIVE = re.compile(
    rf"^{_PLEASE}(?:don['’]?t|do\s+not|avoid|stop|no\s+more)\s+(?:(?:ever|even|really|just)\s+)?"
    r"(?P<verb>[a-z]+)(?:\s+(?P<next>[a-z]+))?",
    _I,
)
# Negative imperatives about this moment, not about later requests.
_MOMENT_VERBS = frozenset(
    """worry worrying forget mind hesitate bother apologize apologise apologizing panic
    rush stress freak judge laugh cry go leave feel quit lose doubt underestimate overthink
    beat blame take get""".split()  # noqa: SIM905
)
_ENCOURAGEMENT = frozenset((("give", "up"), ("let", "it"), ("let", "that"), ("let", "them")))
# Imperatives that shape an answer; lasting only with a scope or a lasting word.
_ANSWER_VERB = re.compile(
    rf"^{_PLEASE}(?:use|give|answer|reply|respond|write|keep|include|provide|show|format"
    r"|add|explain|call|address|list|mention|put|cite|quote|speak|stick|remember|assume"
    r"|make|start|end|limit|summari[sz]e|be|translate|display|label|mark|highlight|run"
    r"|verify|check|validate|confirm|document|mask|enable|require|log|enforce|follow|offer"
    r"|recommend|suggest|ask|prefer|default|send|sign|refer|spell|round|convert|avoid"
    r"|tell|let|double-check|report)\b",
    _I,
)
# "I want you to always ...", "I'd like you to ...", "I always want to see ... when ...".
_WISH = re.compile(
    r"\bi(?:\s+|(?=['’]))(?:(?:really|always|usually|generally|also)\s+)*(?:want|need|like|wish|expect"
    r"|['’]d\s+like|would\s+like|['’]d\s+love|would\s+love|['’]d\s+prefer|would\s+prefer)"
    r"\s+(?P<you>you\s+to\b|to\s+(?:see|get|have|receive|be\s+(?:given|shown|told))\b)?",
    _I,
)
_PREFER = re.compile(
    r"\bi(?:\s+|(?=['’]))(?:(?:really|strongly|generally|usually|much|still|also|now|definitely|do"
    r"|personally)\s+)*(?:['’]d\s+|would\s+)?prefer\s+(?P<obj>.+)$"
    r"|\bi(?:['’]d|\s+would)\s+(?:much\s+)?rather\s+(?P<rather>.+)$"
    r"|\bi(?:['’]ve|\s+have)?\s+(?:set|stated|expressed|got|have|made)\s+(?:a\s+|my\s+)?"
    r"(?:clear\s+|strong\s+)?preference\s+(?:for|of)\s+(?P<set>.+)$"
    r"|\bmy\s+(?:strong\s+|clear\s+|general\s+)?preference\s+is\s+(?:for\s+|to\s+)?(?P<mine>.+)$",
    _I,
)
# The preferred thing ends where a reason or another clause starts.
_OBJECT_END = re.compile(
    r"\s*(?:[,;:(]|\s-\s|\s(?:but|so|because|since|as|due\s+to|despite|although|though"
    r"|while|which|given|especially|and\s+i|and\s+i['’]m|and\s+we)\s).*$",
    _I,
)
# An object that stands for what was said before it: "this approach", "it", "over Y".
_DEICTIC = re.compile(
    r"^(?:(?:this|that|it|these|those|them|such)(?:\s+(?:approach|one|way|option|method"
    r"|setup|solution|design|pattern|style|tool|library|model))?\b\s*"
    r"|(?=(?:over|rather\s+than|instead\s+of)\b))",
    _I,
)
_HEAD_CLAUSE = re.compile(
    r"^(?:(?:i['’]m|i\s+am)\s+(?:trying|planning|looking|going|working|about)\s+(?:to|on)\s+"
    r"|i\s+(?:want|need|plan|intend|decided|have\s+decided|['’]ve\s+decided)\s+to\s+"
    r"|i(?:['’]ve|\s+have)\s+been\s+|i['’]m\s+|i\s+am\s+|i(?:['’]ve|\s+have)\s+|i\s+)",
    _I,
)
_DIET = re.compile(
    r"\bi(?:['’]m|\s+am)\s+(?:a\s+|an\s+)?(?:strict\s+|fully\s+|mostly\s+)?"
    r"(?:vegetarian|vegan|pescatarian|pescetarian|teetotal(?:l?er)?|coeliac|celiac|diabetic"
    r"|lactose[- ]intolerant|gluten[- ]intolerant|on\s+a\s+(?:gluten[- ]free|keto|low[- ]carb"
    r"|low[- ]sodium|halal|kosher|vegan|vegetarian)\s+diet)\b"
    r"|\bi(?:['’]m|\s+am)\s+(?:severely\s+|very\s+|highly\s+|mildly\s+|deathly\s+)?"
    r"(?:allergic|intolerant)\s+to\b"
    r"|\bi\s+(?:do\s+not|don['’]t|never|can['’]?t|cannot|can\s+not)\s+eat\b"
    r"|\bi\s+(?:keep|eat\s+only|only\s+eat|eat)\s+(?:kosher|halal)\b"
    r"|\bi\s+(?:do\s+not|don['’]t|never)\s+drink\s+(?:alcohol|any\s+alcohol|coffee|caffeine)\b",
    _I,
)
# Not the user's own standing wish: relayed ("I've been told to always ...") or a report.
_RELAYED = re.compile(
    r"\b(?:been\s+(?:told|instructed|asked|advised)|was\s+(?:told|instructed|asked))\b", _I
)

_ZH_SCOPE = re.compile(
    r"(?:当|每当|每次)?我(?:问到|问起|询问|提到|谈到|聊到|问)(?:关于|有关)?(?P<scope>[^，。,！!？?；;]+?)"
    r"(?:的(?:问题|事情|事)?)?(?:的时候|时候|时|，|,|$)"
)
_ZH_INSTRUCTION = re.compile(
    r"^(?:请|以后|今后|从现在开始|从今以后|往后)?[，,]?\s*(?:请)?(?:不要|别|千万别|不用|永远不要|总是|始终"
    r"|一直|每次都|务必)"
    r"|^(?:以后|今后|从现在开始|从今以后)[，,]?\s*请"
)
_ZH_PREFER = re.compile(r"我(?:更|比较|还是)?(?:偏好|偏爱|倾向于?|宁愿|宁可|更喜欢)(?P<obj>.+)$")
_ZH_DIET = re.compile(r"我(?:是)?(?:素食者|素食主义者|吃素|不吃|不能吃|不喝酒|对.{1,12}过敏)")


# A sentence opening with its scope: "When I ask about X, ..." / "For questions about X, ...".
_LEADING_CLAUSE = re.compile(r"^(?P<clause>[^,，]{3,160})[,，]\s*(?P<rest>.+)$")
_CLAUSE_LINK = re.compile(r"[\s,]*(?:\b(?:and|but|so|which|that)\b[\s,]*)*$", _I)


def _clean(scope: str) -> str | None:
    scope = " ".join(scope.split()).strip(" .,!?;:'\"“”‘’。，！？")
    scope = re.sub(r"^(?:the\s+(?:topic|subject)\s+of\s+|using\s+)", "", scope, flags=_I)
    words = scope.split()
    if len(words) > MAX_SCOPE_WORDS:
        scope = " ".join(words[:MAX_SCOPE_WORDS])
    return scope or None


def _scope(body: str) -> str | None:
    m = _SCOPE.search(body)
    if m is None:
        return None
    return _clean(_SCOPE_END.sub("", m.group("scope")))


def _preference_scope(body: str, m: re.Match[str]) -> str | None:
    """What is preferred: the object of "prefer" up to a reason or another clause; "this
    approach" stands for the clause before it ("I'm building X, and I prefer this
    approach over Y" -> "building X over Y")."""
    start = next(m.start(g) for g in ("obj", "rather", "set", "mine") if m.group(g))
    obj = _OBJECT_END.sub("", body[start:])
    deictic = _DEICTIC.match(obj)
    if deictic is not None:
        head = _CLAUSE_LINK.sub("", body[: m.start()]).strip(" ,")
        head = _HEAD_CLAUSE.sub("", head)
        obj = f"{head} {obj[deictic.end() :]}" if head else obj
    return _clean(obj)


def standing(body: str, *, chinese: bool = False) -> Standing | None:
    """The standing instruction or preference ``body`` (one sentence of the user's, as said)
    states, or None. See the module docstring for the rules."""
    body = body.strip()
    if chinese:
        return _standing_zh(body)
    if _RELAYED.search(body):
        return None
    scope = _scope(body)
    lead = _LEADING_CLAUSE.match(body)
    if scope is not None and lead is not None and _SCOPE.match(lead.group("clause")):
        body = lead.group("rest")  # "For questions about travel, always include visas"
    if _SAYING.search(body):
        return None
    always = _ALWAYS_NEVER.match(body)
    if always is not None:
        verb = always.group("verb").lower()
        if verb in _NOT_IMPERATIVE or verb.endswith("ing"):
            return None
        return Standing("instruction", scope)
    negative = _NEGATIVE.match(body)
    if negative is not None:
        verb = negative.group("verb").lower()
        after = (negative.group("next") or "").lower()
        encouragement = (verb, after) in _ENCOURAGEMENT or (
            verb == "be" and after in ("sorry", "afraid", "shy", "upset", "mad", "sad", "so")
        )
        if verb not in _MOMENT_VERBS and not encouragement:
            return Standing("instruction", scope)
    if _ANSWER_VERB.match(body) and (scope is not None or _LASTING.search(body)):
        return Standing("instruction", scope)
    wish = _WISH.search(body)
    if wish is not None and (scope is not None or (wish.group("you") and _LASTING.search(body))):
        return Standing("instruction", scope)
    preference = _PREFER.search(body)
    if preference is not None:
        return Standing("preference", scope or _preference_scope(body, preference))
    if _DIET.search(body):
        return Standing("constraint", None)
    return None


def _standing_zh(body: str) -> Standing | None:
    m = _ZH_SCOPE.search(body)
    scope = _clean(m.group("scope")) if m is not None else None
    if m is not None and m.start() == 0:
        body = body[m.end() :].lstrip("，, ")  # "当我问到X的时候，请总是..."
    if _ZH_INSTRUCTION.match(body) or (scope is not None and body.startswith("请")):
        return Standing("instruction", scope)
    preference = _ZH_PREFER.search(body)
    if preference is not None:
        return Standing("preference", scope or _clean(preference.group("obj")))
    if _ZH_DIET.search(body):
        return Standing("constraint", None)
    return None
