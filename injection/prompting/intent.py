"""Whether a memory asks the assistant something about its replies (issue 57).

Members write about answer styles, words and languages without asking for them: a complaint
("answers in capitals feel like shouting"), someone else's habit ("my sister types in
lowercase"), a past job's format, something imagined, a rule for some messages only ("if I
ask about football, ..."). Only a request addressed to the assistant about its replies is a
standing instruction (``reminder.standing``) and may become a rule (``rules.py``).

A sentence is a request when it is not conditional (``CONDITION``: a topic, a weekday, a
message's language; conditions are not honoured, so such a memory gets no rule at all), not
about the past (``PAST``), not hypothetical (``HYPOTHETICAL``), not someone's habit told in
the third person (``_HABIT``: "a bot I like always replies in Japanese"), and either

* one of its clauses is an imperative ("reply in lowercase", "so leave them out of your
  answers", "never use commas": ``_IMPERATIVE``), or
* it asks in another form ("I'd like your answers in French", "your replies must ...",
  "every answer in German, thanks", "could you ...": ``_ASKS``), and is neither a complaint
  (``_COMPLAINT``) nor about someone else (it opens with "my sister ...").

``requests(text)`` is the text's request sentences ('' where none); readers read rules from
them alone.
"""

from __future__ import annotations

import re

from injection.prompting.readers import QUOTED, TITLES

__all__ = ["CONDITION", "HYPOTHETICAL", "PAST", "is_request", "requests"]

_REPLY = r"(?:answers?|repl(?:y|ies)|responses?)"
_DAYS = (r"(?:mon|tues|wednes|thurs|fri|satur|sun|week)days?|weekends?|holidays?|"
         r"(?:my\s+)?birthdays?|rainy\s+days?|(?:\w+\s+)?(?:mornings?|evenings?|nights?)|"
         r"(?:my\s+)?days?\s+off|vacations?")
# what opens a sentence "X: ..." without scoping it: a note, or every reply ("Every answer: ...")
_NOTE = (r"(?:important|note|notes?\s+to\s+self|reminder|rule|preference|request|ps|p\.s|tip|"
         r"fyi|format|formatting|style|language|tone|always|please|also|and|so|"
         r"(?:(?:every|each|all|any|your|my)\s+)*(?:of\s+)?(?:your\s+)?" + _REPLY + r")")
# what a sentence-opening "For ...," names that scopes nothing: every reply, or a purpose
_ALWAYS = (r"(?:every|each|all|any|anything|everything|whatever|me|now|good|ever|once|clarity|"
           r"readability|simplicity|brevity|accessibility|consistency|reference|convenience|"
           r"example|instance|fun|safety|ease|your\s+" + _REPLY + r"|the\s+(?:time\s+being|rest|"
           r"future|record))\b")
# a kind of message or task a rule may be scoped to ("for crypto questions, ...")
_TASKS = (r"(?:questions?|topics?|requests?|queries|emails?|messages?|letters?|essays?|posts?|"
          r"tweets?|homework|assignments?|exercises?|stories|reports?|reviews?|drafts?|code|"
          r"recipes?|speech(?:es)?|eulog(?:y|ies)|captions?|texts?|notes?|summaries)")
CONDITION = re.compile(
    r"(?<!even )\b(?:if|unless|in\s+case|as\s+long\s+as)\b(?!\s+(?:you\s+can|possible|needed|"
    r"necessary|you\s+(?:reply|answer|respond|write)))"
    r"|(?<!even )\b(?:when|whenever|every\s+time|each\s+time|any\s+time|once)\s+(?:I|I'm|my|the|"
    r"it|it's|we|someone|there|a|an|your\s+" + _REPLY + r"\s+(?:is|are)\s+(?:about|on|for))\b"
    r"|\b(?:when|whenever)\s+you(?:'re|\s+are)?\s+(?!(?:reply|answer|respond|writ|talk|speak|"
    r"get\s+back)\w*\b)[a-z]+"
    r"|\b(?:reply|respond|answer)\s+(?:to\s+)?(?:that|those|these)\b"
    r"|\b(?:that'?s|this\s+is|it'?s)\s+(?:just|only)\s+for\b|\bjust\s+for\s+(?!fun\b)"
    r"|(?<!even )\b(?:when|whenever)\s+(?!(?:you|replying|answering|responding|writing|talking|"
    r"possible|needed|necessary|appropriate|relevant|asked|unsure|in\s+doubt)\b)[a-z]+\s+[a-z]+"
    r"|\b(?:on|at|during|over)\s+(?:the\s+)?(?:" + _DAYS + r")\b|\bduring\s+\w+"
    r"|\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b|\bonly\s+(?:for|when|whenever|on|during|"
    r"while|at)\b"
    r"|\bfor\s+(?!(?:every|each|all|any)\b)(?:(?!(?:answers?|repl\w*|responses?)\b)[\w&'-]+\s+)"
    r"{0,3}?" + _TASKS + r"\b"
    r"|^\s*(?:for|when\s+it\s+comes\s+to)\s+(?!" + _ALWAYS + r")[^,:]{1,60}[,:]"
    r"|\bin\s+the\s+(?:mornings?|evenings?|afternoons?)\b|\bat\s+night\b"
    r"|\bfor\s+(?:anything|everything|something|stuff|things)\s+(?:\w+\s+)?(?:about|on|"
    r"regarding|related\s+to|to\s+do\s+with)\b"
    r"|\b(?:sometimes|occasionally|now\s+and\s+then|from\s+time\s+to\s+time|at\s+times|"
    r"once\s+in\s+a\s+while|every\s+so\s+often)\b", re.I)
PAST = re.compile(
    r"\bused\s+to\b|\b(?:years?|months?|weeks?)\s+(?:ago|back)\b|\bback\s+(?:then|in\s+(?:the|my|\d{4}|school|college)|when)\b"
    r"|\bwhen\s+I\s+was\b|\b(?:at|in)\s+my\s+(?:old|last|previous|former|first)\b"
    r"|\b(?:former|previous)\s+\w+|\b(?:previously|formerly)\b|\bas\s+an?\s+(?:teenager|kid|child|intern|student)\b"
    r"|\bbefore\s+I\s+(?:retired|left|moved|quit)\b|\blast\s+(?:year|month|week|summer)\b"
    r"|\bin\s+my\s+(?:twenties|thirties|forties|teens|youth|childhood)\b|\bfor\s+a\s+while\b"
    r"|\bhad\s+to\b"
    r"|(?<!as )\b(?:I|we)\s+(?:\w+ly\s+)?(?:wrote|answered|signed|spoke|replied|kept|typed|stopped|"
    r"spent|closed|added|avoided|made|said|was|were|did|started|ended|responded|"
    r"began)\b", re.I)
HYPOTHETICAL = re.compile(
    r"\b(?:imagine|suppose|supposing|picture|pretend|hypothetically|daydream\w*|wonder(?:s|ed|ing)?|"
    r"someday|one\s+day|what\s+if|curious|dared?|fictional|tempt\w*|next\s+time)\b"
    r"|\b(?:would|might|could)\s+(?:be|happen|look|seem|read|sound|learn|try)\b"
    r"|\bthought\s+about\b|\bin\s+(?:a|an|my|the|our|his|her)\s+(?:[\w-]+\s+)?(?:story|novel|"
    r"game|play|dream|screenplay|comic|cartoon|book|fiction|role-?play\w*|drafts?|manuscripts?|"
    r"scripts?|campaigns?|fanfic\w*|sketch(?:es)?|poems?)\b", re.I)
_LEAD = (r"(?:(?:please|kindly|always|also|just|only|and|so|then|simply|now|from\s+now\s+on|"
         r"going\s+forward|in\s+future|from\s+today|at\s+all\s+times|every\s+time|"
         r"for\s+(?:every|each|all)\s+(?:\w+\s+)?" + _REPLY + r"|(?:when|whenever)\s+(?:you\s+)?"
         r"(?:reply|answer|respond|write|talk)\w*(?:\s+(?:to\s+)?me)?|whatever\s+I\s+\w+|"
         r"no\s+matter\s+what(?:\s+I\s+\w+)?)[\s,]+)*")
_VERBS = (r"(?:reply|respond|answer|write|speak|talk|use|keep|start|begin|open|end|finish|close|"
          r"conclude|sign|mention|address|call|explain|give|format|translate|include|add|put|"
          r"limit|cap|make|tell|show|list|summari[sz]e|cite|spell|stick|refer|stop|switch|greet|"
          r"avoid|leave|wrap|enclose|surround|quote|repeat|restate|copy|echo|say|type|work|"
          r"insert|highlight|emphasi[sz]e|mark|communicate|structure|title|pick|choose|be|"
          r"capitali[sz]e|recommend|suggest|forget|prefer|skip|omit|drop|spare|"
          r"(?:don'?t|do\s+not|never)(?=\s+(?:ever\s+)?" + "(?:reply|respond|answer|write|speak|talk|"
          r"use|keep|start|begin|open|end|finish|close|conclude|sign|mention|address|call|"
          r"explain|give|format|translate|include|add|put|limit|cap|make|tell|show|list|say|"
          r"type|stop|switch|avoid|leave|wrap|enclose|quote|repeat|forget|be|ever|highlight|"
          r"emphasi[sz]e|mark|go|exceed|shout|bother|add|sign)\b))\b")
_IMPERATIVE = re.compile(r"^\s*" + _LEAD + _VERBS, re.I)
# a rule headed by the kind of text it is for ("Cover letters: under 250 words"): a noun
# phrase, then no imperative; not a reason ("I prefer German: write ...", "Commas confuse my
# screen reader: reply with none"), an imperative ("Be brief: ...") or a note
_HEADED = re.compile(r"^\s*(?!(?:" + _NOTE + r")\s*:)(?!(?:I|I'm|I've|I'd|my|me|we|our|it|this|"
                     r"that|there|be)\b)(?!" + _LEAD + _VERBS + r")(?:[\w'&-]+\s+){0,5}?[\w'&-]+"
                     r"\s*:\s+(?!" + _LEAD + _VERBS + r")", re.I)
# a reply's verb: an imperative of it after "so", "and", ... is the assistant's to do
_WRITES = re.compile(r"\b(?:repl(?:y|ies|ying|ied)|respond\w*|answer\w*|writ(?:e|es|ing)|"
                     r"speak\w*|talk\w*|typ(?:e|ing)|say\w*|greet\w*|communicat\w*)\b|\bme\b",
                     re.I)
_CLAUSE = re.compile(r"[,;:\u2013\u2014]\s*|\s+-\s+|\b(?:and|so|but|then)\s+", re.I)
_ADDRESS = re.compile(r"\b(?:you|your|yours)\b|\b" + _REPLY + r"\b", re.I)
_ASKS = re.compile(
    r"\b(?:could|can|would|will)\s+you\b|\byou\s+(?:should|must|shall|need\s+to|have\s+to|"
    r"are\s+to|ought\s+to|always|never|only)\b"
    r"|\bI(?:'d|\s+would)?\s+(?:really\s+|much\s+)?(?:like|love|prefer|want|need|ask|expect|"
    r"appreciate|rather)\b|\b(?:please|thanks|thank\s+you)\b|\bmake\s+sure\b"
    r"|\b(?:every|each|all(?:\s+of)?|per|only|just|nothing\s+but)\b"
    r"|\b(?:prefer|want|need|like)\s+(?:my|your|all|every|the)\s+(?:\w+\s+)?" + _REPLY + r"\b"
    r"|\b" + _REPLY + r"\b(?:\s+\S+){0,6}?\s+(?:should|must|needs?|has\s+to|have\s+to|shall|"
    r"may\s+only|are\s+to|ought\s+to)\b|\b(?:every\s+time|whenever|when)\s+you\s+"
    r"(?:reply|answer|respond|write)", re.I)
_COMPLAINT = re.compile(
    r"\b(?:feels?|looks?|seems?|sounds?|annoy\w*|irritat\w*|bother\w*|bugs?|hate|dislike|"
    r"detest|loathe|can'?t\s+(?:stand|bear)|cannot\s+(?:stand|bear)|headaches?|tiring|"
    r"hard\s+(?:for\s+me\s+)?to|drives?\s+me|stress\w*|anxious|rude|lazy|sloppy|"
    r"unprofessional|aggressive|childish|fake|grat(?:e|es|ing)|put\s+me\s+off|exhaust\w*|"
    r"not\s+a\s+fan|tired\s+of|unpleasant|confus\w*|cringe\w*|curt|wince|robotic|"
    r"condescending|patroni[sz]ing|off-?putting|jarring|awkward|makes?\s+me\s+(?:cringe|wince|"
    r"sigh|squint|angry|mad|nervous|tired|sad|dizzy|uneasy|uncomfortable|want\s+to))\b", re.I)
_SOMEONE = re.compile(r"^\s*(?:my|our|his|her|their)\s+(?!" + _REPLY + r"\b)[\w'-]+", re.I)
# someone else's replies ("every answer from our helpdesk starts with ..."), not the assistant's
_THEIRS = re.compile(r"\b" + _REPLY + r"\s+(?:(?:from|by)\s+(?!(?:you|yours|now|here|today|"
                     r"then|time)\b)\w+|of\s+(?:my|our|his|her|their|the)\s)", re.I)
# someone's habit, told in the third person ("a bot I like always replies in Japanese"); not
# where the sentence speaks to the assistant ("your answer always ends with a question, please")
_TO_YOU = re.compile(r"\b(?:you|your|yours|please|kindly)\b", re.I)
# ... or with no adverb, where a person or thing opens the sentence ("The streamer I watch
# replies to chat only in caps")
_HABITUAL = re.compile(r"^\s*(?:the|a|an|this|that|one|some)\s+(?!" + _REPLY + r"\b)[\w'-]+"
                       r"(?:\s+[\w'-]+){0,4}?\s+(?:replies|answers|responds|writes|speaks|talks|"
                       r"types|signs|texts|posts|accepts|closes|opens|ends|starts|uses|says|"
                       r"prints|sends|puts|adds|labels|marks|only\s+\w+s)\b"
                       r"|^\s*(?:my|our|his|her|their)\s+(?!" + _REPLY + r"\b)[\w'.-]+"
                       r"(?:\s+[\w'.-]+){0,4}?\s+(?:ends|starts|opens|closes|signs|replies|answers|"
                       r"writes|types|texts|says|uses|accepts)\b", re.I)
# an idiom that opens a sentence with an imperative it does not mean ("Call me old-fashioned,
# but ..."): what follows is read alone
_IDIOM = re.compile(r"^\s*(?:call\s+me\s+[\w-]+|don'?t\s+get\s+me\s+wrong|trust\s+me|"
                    r"believe\s+me|mind\s+you|let'?s\s+face\s+it|say\s+what\s+you\s+(?:will|like))"
                    r"\s*,\s*(?:but\s+)?", re.I)
_HABIT = re.compile(r"\b(?:always|usually|often|never|only|still|mostly)\s+(?:replies|answers|"
                    r"responds|writes|speaks|talks|types|signs|starts|ends)\b", re.I)
_PLEASE = re.compile(r"\b(?:please|kindly)\b", re.I)
# a first-person statement going on without its subject ("I can read Arabic but don't speak
# it"): what follows "but"/"and" is still about the member, not an imperative
_ELLIPSIS = re.compile(r"^\s*I\b[^,;.]*\b(?:but|and)\s+(?:don'?t|do\s+not|never|can'?t|also|"
                       r"still|only|rarely)\b", re.I)
# a sentence about replies of some kind ("Replies that just say 'Correct' and stop there feel
# curt to me"): with a complaint, its verbs describe those replies, not what to do
_DESCRIBED = re.compile(r"^\s*(?:\w+\s+){0,2}?" + _REPLY + r"\s+(?:that|which|with|without|"
                        r"in|full|written|made|ending|starting|opening|where)\b", re.I)
_SPLIT = re.compile(r"(?<=[!?])\s+|" + TITLES + r"(?<=\.)\s+(?=[A-Z])")


def is_request(sentence: str) -> bool:
    """Whether ``sentence`` asks the assistant something about its replies (see module)."""
    sentence = _IDIOM.sub("", sentence)
    theirs = (_HABIT.search(sentence) or _HABITUAL.match(sentence)) and not _TO_YOU.search(
        QUOTED.sub("'x'", sentence))  # "you" inside a quote speaks to nobody here
    if any(p.search(sentence) for p in (CONDITION, PAST, HYPOTHETICAL)) or theirs or (
            _DESCRIBED.match(sentence) and _COMPLAINT.search(sentence)) or _HEADED.match(sentence):
        return False
    clauses = [c for c in _CLAUSE.split(sentence) if c and c.strip()]
    if clauses and _IMPERATIVE.match(clauses[0]):
        return True
    if not _ELLIPSIS.match(sentence) and any(_IMPERATIVE.match(c) for c in clauses[1:]) and (
            _WRITES.search(sentence) or _ADDRESS.search(sentence) or _PLEASE.search(sentence)):
        return True
    return (bool(_ASKS.search(sentence)) and bool(_ADDRESS.search(sentence))
            and not _COMPLAINT.search(sentence) and not _SOMEONE.match(sentence)
            and not _THEIRS.search(sentence))


def requests(text: str) -> str:
    """The request sentences of ``text`` (see module), joined; '' where there are none."""
    return " ".join(s for s in _SPLIT.split((text or "").strip()) if s and is_request(s))
