"""Memories read as their members meant them (issue 57): a memory that is not a request to
the assistant about its replies gets no rule (no decoding constraint, no guidance, not a
standing instruction); a negation never becomes the opposite rule; a tenant's quoted ban is
kept; a language beside a kept constraint is still guided. The readers' misreading figures
are bench/bench_misreading.py's; these are the issue's own examples and a few per kind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.metrics import Metrics
from injection.prompting import rules
from injection.prompting.constraints import detect
from injection.prompting.reminder import standing

NOT_RULES = {
    "dislike": ["Replies in capital letters give me a headache.",
                "Answers that open with 'Sure thing' and stop there seem curt to me.",
                "Answers that begin with 'Great, thanks for asking' make me cringe.",
                "Call me picky, but a reply typed all in capitals feels like shouting.",
                "I really cannot stand all-caps answers.",
                "I dislike it when someone replies in lowercase.",
                "Answers with no commas at all are hard for me to follow."],
    "others": ["My brother writes all his replies in lowercase.",
               "The podcast host I follow answers every email only in lowercase.",
               "My aunt Mrs. Patel ends every letter with 'Bless you'.",
               "The booking app only accepts 'Yes' or 'No' as answers.",
               "The helpdesk closes every ticket with 'Have you tried restarting?'.",
               "My manager answers every message in under 15 words.",
               "Her emails always start with 'Dear all'.",
               "The chatbot at my bank always answers in capital letters.",
               "Every reply from the council's help desk ends with 'Kind regards'."],
    "condition": ["If I ask about sports, only answer 'Yes' or 'No'.",
                  "On Mondays, start your replies with 'Morning!'.",
                  "If I write in German, reply in German.",
                  "Now and then I enjoy answers in lowercase.",
                  "For questions about tax, keep answers under 20 words.",
                  "When your answer is about my garden, keep it under 30 words.",
                  "For anything to do with my thesis, reply in lowercase.",
                  "For my Spanish homework, answer in Spanish.",
                  "Whenever replies come in all capitals I skim them.",
                  "For cover letters you draft for me, end with 'Yours sincerely'.",
                  "For the toast I'm writing, don't use the word 'honestly'.",
                  "For chess questions, answer only 'Good move' or 'Bad move'.",
                  "On my days off, start replies with 'Hey!'.",
                  "Over the holidays, reply in Italian.",
                  "Fridays only: write to me in lowercase.",
                  "Reply in Dutch, but only for my Dutch course exercises.",
                  "For product descriptions, write the headings in uppercase.",
                  "When it comes to recipes, list the steps as three bullet points.",
                  "When you help with my sewing plans, keep each step under 10 words.",
                  "Wedding speeches: under 300 words, ending with 'Cheers to the couple'.",
                  "Any Welsh from me is practice - reply to that in Welsh.",
                  "Poems you write for me go in lowercase; that's just for poems though.",
                  "Texts that start with 'IT:' are Italian practice, so answer those in Italian."],
    "past": ["I used to reply to every email in capital letters.",
             "At the agency, every press reply had to be under 150 words.",
             "At my previous job, answers had to end with 'Regards'."],
    "hypothetical": ["Imagine an assistant that answers only in French.",
                     "In my sci-fi manuscript, the robot replies to everything in Latin.",
                     "I'm tempted to answer my sister only in capitals next time.",
                     "It would be strange if every answer started with 'Behold'."],
    "quoted": ["My favourite word is 'lowercase'.", "I am reading 'No Commas Allowed'."],
    "language": ["I teach Portuguese.", "My uncle only speaks Greek.",
                 "I can read Hebrew script but don't speak the language.",
                 "We moved to Spain last spring."],
}
NEGATED = ["Please do not reply in lowercase.", "Don't answer me in capital letters.",
           "Never write your replies in all caps.", "Do not answer in Spanish.",
           "Don't reply only in capital letters.",  # "not only": no rule, not the one named
           "Do not answer with only 'True' or 'False'."]
# "I'd rather you didn't ...": what is refused is not asked, whatever else the memory names
REFUSED = ["I'd rather you didn't answer in Polish just because my name sounds Polish.",
           "I'd rather you didn't reply in Finnish; my husband is the Finnish one.",
           "I'd prefer you didn't sign off with 'Best regards'.",
           "i'd rather you didn't write in all lowercase",
           "Please don't strip the capital letters out of your answers.",  # as usual
           "Don't leave off the capital 'I', please.",
           "Please don't stop using capital letters, even if I forget to.",
           "Don't write sentences without a capital at the start, please.",
           "Don't go skipping commas just to sound casual.",
           "I don't need my answers in exactly three bullets.",
           "Please don't answer in Frisian; we all speak English at my office."]


@pytest.mark.parametrize("memory", [m for ms in NOT_RULES.values() for m in ms])
def test_a_memory_that_asks_nothing_gets_no_rule(memory):
    assert rules.read(memory) == rules.NONE
    assert detect([memory]) == () and not standing(memory)
    assert detect([], memory) == ()  # as a tenant's instructions: none for any member


@pytest.mark.parametrize("memory", NEGATED)
def test_a_negation_is_never_the_opposite_rule(memory):
    read = rules.read(memory)
    assert read.standing  # a request, asking for nothing the decoder or the guide keeps
    assert read.constraints == () and read.language is None
    assert not rules.guided(read, ()) and detect([], memory) == ()


@pytest.mark.parametrize("memory", REFUSED)
def test_what_a_member_would_rather_not_have_is_no_rule(memory):
    read = rules.read(memory)
    assert read.constraints == () and read.language is None
    assert not rules.guided(read, ()) and detect([], memory) == ()


def test_requests_of_the_same_forms_are_still_rules():
    assert rules.read("Please reply in lowercase.").constraints == ("lowercase",)
    assert rules.read("Don't use capital letters in your replies.").constraints == (
        "lowercase",)  # the capitals themselves banned: lowercase, as asked
    assert rules.read("I dislike commas, so leave them out of your answers.").constraints == (
        "no_comma",)
    assert rules.read("My family speaks Greek, so reply in Greek.").language == "Greek"
    assert rules.read("Don't use English with me, use German.").language == "German"
    assert rules.read("Reply in French even when I write in English.").language == "French"
    assert rules.read("When you answer, never use commas.").constraints == ("no_comma",)
    assert rules.read("Don't forget to reply in lowercase.").constraints == ("lowercase",)
    assert rules.read("Use nothing but capital letters.").constraints == ("uppercase",)
    assert rules.read("Every reply always ends with 'Cheers', please.").constraints == (
        "end:Cheers",)  # said to the assistant: not someone's habit
    assert rules.read("Only ever reply with 'True' or 'False'.").constraints == (
        "choice:True|False",)
    assert rules.read("Whenever you reply, use lowercase.").constraints == ("lowercase",)
    assert rules.read("Every answer from you should end with 'Cheers'.").constraints == (
        "end:Cheers",)  # the assistant's own answers
    assert rules.read("Thirty words max per answer, please.").constraints == ("max_words:31",)
    assert rules.read("Keep answers to 40 words or less.").constraints == ("max_words:41",)
    assert rules.read("For every reply, use lowercase.").constraints == ("lowercase",)
    assert rules.read("For all your answers, use lowercase.").constraints == ("lowercase",)
    assert rules.read("For clarity, keep every answer under 40 words.").constraints == (
        "max_words:40",)  # a purpose, not a scope
    assert rules.read("I prefer Greek: write your replies in Greek.").language == "Greek"
    assert rules.read("Whatever I ask, answer in ALL CAPS.").constraints == ("uppercase",)
    assert rules.read("No matter what I ask, answer in ALL CAPS.").constraints == (
        "uppercase",)  # "no matter" negates nothing
    assert rules.read("Every time you reply, leave the commas out.").constraints == ("no_comma",)
    assert rules.read("Please never go beyond two sentences in a reply.").constraints == (
        "max_sentences:2",)
    assert rules.read("Work the word 'marvellous' into every answer, please - it makes me "
                      "smile.").constraints == ("word:marvellous:1",)
    assert rules.read("Each of your replies should be two sentences, no more.").constraints == (
        "max_sentences:2",)
    assert rules.read("hey, could you write in lowercase? capitals feel loud to me").constraints == (
        "lowercase",)  # a complaint after the request is a sentence of its own
    assert rules.read("I hate capitals, so write in lowercase.").constraints == ("lowercase",)
    assert rules.read("Don't answer in English; use Spanish.").language == "Spanish"


def test_a_tenants_quoted_ban_is_kept():
    ban = "Never use the word 'basically'."
    assert detect([], ban) == ("ban:basically",)
    # its banned word is no literal the replies hold: a member's capitals stay too
    assert detect(["Always answer in capital letters."], ban) == ("ban:basically", "uppercase")
    assert detect(["Reply in lowercase."], "Start every reply with 'Acme:'.") == (
        "start:Acme:",)  # a literal the replies do hold still wins


def test_a_language_beside_a_kept_constraint_is_still_guided():
    read = rules.read("Answer in French, never with commas.")
    assert (read.constraints, read.language) == (("no_comma",), "French")
    assert rules.guided(read, ("no_comma",))  # the decoder keeps the commas, not French
    alone = rules.read("Answer in lowercase, never with commas.")
    assert not rules.guided(alone, ("lowercase", "no_comma"))


ASK = [{"role": "user", "content": "How do bees make honey?"}]
# the same question three exchanges deep: the reminder re-states standing memories there and
# the anchor guides where the model's default guidance pays (SmolLM2's profile)
DEEP = [m for q, a in (("Hi!", "Hello! How can I help?"), ("What is rain?", "Water that "
        "falls from clouds."), ("Thanks.", "You're welcome.")) for m in (
        {"role": "user", "content": q}, {"role": "assistant", "content": a})] + ASK
OFF = {"constrain": False, "contrast": 0.0}  # the decoder's rules off
# the issue's own examples, one or more per kind it names (issue 57's table)
ISSUE = ["Please do not reply in lowercase.", "Replies in capital letters give me a headache.",
         "I really cannot stand all-caps answers.", "My brother writes all his replies in "
         "lowercase.", "I dislike it when someone replies in lowercase.",
         "Now and then I enjoy answers in lowercase.",
         "If I ask about sports, only answer 'Yes' or 'No'.",
         "On Mondays, start your replies with 'Morning!'.",
         "My manager answers every message in under 15 words.",
         "Answers with no commas at all are hard for me to follow.",
         "If I write in German, reply in German."]


@pytest.fixture(scope="module")
def executor(adapter):
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    yield ex
    ex.close()


def _same(a, b) -> bool:
    return (a.text, a.completion_tokens, a.constraints, a.contrast_effective) == (
        b.text, b.completion_tokens, b.constraints, b.contrast_effective)


@pytest.mark.parametrize("memory", sorted({*ISSUE, *NEGATED, *(m for ms in NOT_RULES.values()
                                                                 for m in ms)}))
def test_a_memory_read_as_no_rule_replies_as_with_the_rules_off(executor, memory):
    """On the demo model, each kind of misreading: the member's memory stored with the rules
    read from it gives on the defaults the reply it gives with the decoder's rules off,
    token for token, on a first turn and a deep one; so do the same words as a tenant's
    instructions. (A request's own strength guides any memory, as asked: not a default.)"""
    mems = (MemoryItem("m", memory, rules=rules.read(memory)),)

    def ask(msgs=ASK, **kw):
        return executor.execute(ExecutionRequest("t", "u", msgs, max_new_tokens=16, **kw))

    for msgs in (ASK, DEEP):
        on, off = ask(msgs, memories=mems), ask(msgs, memories=mems, **OFF)
        assert on.constraints == [] and on.contrast_effective == 0.0 and _same(on, off)
    assert not rules.guided(mems[0].rules, ())  # the default strength guides it nowhere
    assert _same(ask(instructions=memory), ask(instructions=memory, **OFF))


def test_the_same_check_sees_a_rule_that_is_asked(executor):
    """The controls: a request of the same forms changes the demo model's reply."""
    def ask(memory, msgs, **kw):
        mems = (MemoryItem("m", memory, rules=rules.read(memory)),)
        return executor.execute(ExecutionRequest("t", "u", msgs, memories=mems,
                                                 max_new_tokens=16, **kw))

    lower = "Please reply in lowercase, without commas."
    for msgs in (ASK, DEEP):
        on, off = ask(lower, msgs), ask(lower, msgs, **OFF)
        assert on.constraints == ["lowercase", "no_comma"] and not _same(on, off)


@pytest.mark.slow
@pytest.mark.real_model
def test_a_memory_read_as_no_rule_gets_the_reply_it_gets_with_the_rules_off(smollm):
    """Greedy on SmolLM2, the issue's examples (every kind of its table) on a first turn and
    a deep one (where its profile's anchor guides a memory that pays), and a tenant's
    negation, defaults against constraints and guidance off: token for token. The requests
    go in at once, so the engine batches them (a batched reply is the one alone:
    test_batch.py)."""
    tenant = "Do not answer in lowercase."
    reqs = {(memory, depth, on): ExecutionRequest(
        "t", "u", msgs, memories=(MemoryItem("m", memory, rules=rules.read(memory)),),
        max_new_tokens=16, **({} if on else OFF))
        for memory in ISSUE for depth, msgs in (("first", ASK), ("deep", DEEP))
        for on in (True, False)}
    reqs |= {(tenant, "tenant", on): ExecutionRequest(
        "t", "u", ASK, instructions=tenant, max_new_tokens=16, **({} if on else OFF))
        for on in (True, False)}
    ex = build_executor(smollm, batch_max=8, metrics=Metrics())
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = dict(zip(reqs, pool.map(ex.execute, reqs.values()), strict=True))
    finally:
        ex.close()
    for memory, depth in {k[:2] for k in reqs}:
        on, off = got[memory, depth, True], got[memory, depth, False]
        assert on.constraints == [] and on.contrast_effective == 0.0, (memory, depth)
        assert _same(on, off), (memory, depth)
