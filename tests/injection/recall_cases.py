"""Recall cases: a member's memories (one topic each) and messages with the memories that
are relevant to them (tests/injection/test_memory_recall.py, bench/bench_recall.py).
Set A was used to choose the embedding recipe (``injection/memory/embed.py``); set B was
written afterwards and not tuned on."""

from __future__ import annotations

SET_A_MEMORIES = (
    "I am vegetarian and never eat meat or fish.", "I live in Lisbon, Portugal.",
    "My dog is called Biscuit, a golden retriever.", "I prefer short answers in bullet points.",
    "I am allergic to peanuts.", "I work as a nurse on night shifts.",
    "My daughter Mia is learning to play the violin.", "I am training for a marathon in April.",
    "I write code in Python with VS Code.", "I am saving money for a trip to Japan.",
)
SET_A_QUERIES = (
    ("What should I cook for dinner tonight?", {0, 4}),
    ("Can you suggest a stretching routine before a long run?", {7}),
    ("Any tips for keeping my pet calm during fireworks?", {2}),
    ("How do I read a CSV file?", {8}),
    ("What is the weather like in my city in winter?", {1}),
    ("How can I sleep better during the day?", {5}),
    ("What gift should I buy for a young musician?", {6}),
    ("How much should I budget for a week in Tokyo?", {9}),
    ("Which snacks are safe for me to take on a hike?", {4}),
    ("Can you recommend a good restaurant near my home?", {1, 0}),
    ("How many kilometres should I run this week?", {7}),
    ("My puppy keeps chewing shoes, what do I do?", {2}),
)
SET_B_MEMORIES = (
    "I drive an old Volvo station wagon.", "I speak German and a little Spanish.",
    "I have two cats named Luna and Pixel.", "I am lactose intolerant.",
    "I teach maths at a secondary school.", "I play the guitar in a jazz band.",
    "My wife and I are expecting a baby in June.", "I am afraid of flying.",
    "I grow tomatoes and basil on my balcony.", "I follow Formula 1 racing.",
)
SET_B_QUERIES = (
    ("My car makes a strange noise when braking, what could it be?", {0}),
    ("How do I say good morning in the languages I know?", {1}),
    ("What food is bad for my pets?", {2}),
    ("Can I have ice cream for dessert?", {3}),
    ("How can I explain fractions to teenagers?", {4}),
    ("Suggest some chords to practise for my next gig.", {5}),
    ("What should we prepare before the baby arrives?", {6}),
    ("What is the best way to travel from London to Rome?", {7}),
    ("Why are the leaves of my plants turning yellow?", {8}),
    ("Who won the last Grand Prix?", {9}),
    ("Which cheese can I eat safely?", {3}),
    ("How do I stop a kitten scratching the sofa?", {2}),
)
SETS = {"A (tuned on)": (SET_A_MEMORIES, SET_A_QUERIES),
        "B (held out)": (SET_B_MEMORIES, SET_B_QUERIES)}
