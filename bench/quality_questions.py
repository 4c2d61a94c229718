"""The quality benchmark's data (bench/quality_cases.py builds the cases): questions,
standing instructions with their arguments, preferences and facts, each in its split."""

from __future__ import annotations

# Open questions a member might ask, none about the member. Tuning and validation never
# share one.
QUESTIONS = {
    "tuning": [
        "How can I get better at remembering people's names?",
        "What is a good way to start learning the guitar?",
        "Why do leaves change colour in autumn?",
        "How do I keep houseplants alive while I am away for a week?",
        "What should I pack for a weekend of camping?",
        "How does a rainbow form?",
        "Can you explain what compound interest is?",
        "What are some tips for a job interview?",
        "How do I make my mornings less rushed?",
        "Why is the sky blue?",
        "What is a healthy way to deal with stress at work?",
        "How do bicycles stay upright?",
        "Give me an idea for a rainy Sunday afternoon.",
        "How should I prepare for running my first 5 km race?",
        "What makes a good password?",
        "How do volcanoes erupt?",
        "What is the best way to learn new vocabulary in a language?",
        "How can I write a polite complaint to my landlord?",
        "Why do cats purr?",
        "How do I choose a good watermelon?",
    ],
    "validation": [
        "How can I sleep better at night?",
        "What is a simple way to save money each month?",
        "How do bees find flowers?",
        "What should I consider before adopting a dog?",
        "How does a refrigerator keep food cold?",
        "What are good habits for studying for an exam?",
        "Why do we have seasons?",
        "How can I make new friends in a new city?",
        "What is the difference between weather and climate?",
        "How do I clean a cast iron pan?",
        "What is a fun activity for a child's birthday party?",
        "How do airplanes stay in the air?",
        "How can I be more productive when working from home?",
        "Why does bread rise?",
        "What should I do if I get lost while hiking?",
        "How does recycling plastic work?",
        "How can I improve my handwriting?",
        "What is a good way to welcome a new neighbour?",
        "How do solar panels make electricity?",
        "Suggest a way to spend a free evening at home.",
    ],
}

# Instruction type -> IFEval checker class and (phrasing, arguments) per split: the member's
# memory as they might write it. Tuning and validation never share an argument or phrasing.
STANDING: dict[str, dict] = {
    "lowercase": {"checker": "LowercaseLettersEnglishChecker", "tuning": [
        ("Always write your replies in lowercase letters only, never capitals.", {}),
        ("Please answer me using only lowercase letters.", {}),
        ("I like every answer typed in all lowercase, with no capital letters.", {}),
        ("Never use capital letters when you reply to me; lowercase only.", {}),
        ("Write everything you say to me in lower case.", {}),
    ], "validation": [
        ("Only lowercase letters in your answers, please, not a single capital.", {}),
        ("I read easier without capitals: reply in lowercase every time.", {}),
        ("Use no uppercase letters at all in your replies.", {}),
        ("Keep all your responses entirely lowercase.", {}),
    ]},
    "capital": {"checker": "CapitalLettersEnglishChecker", "tuning": [
        ("Always answer in capital letters only.", {}),
        ("Write all your replies to me in UPPERCASE letters.", {}),
        ("I have poor eyesight: reply only in block capitals.", {}),
        ("Every word of your answers must be in capitals.", {}),
        ("Please type your responses in all caps.", {}),
    ], "validation": [
        ("Respond to me using uppercase letters only, no lowercase.", {}),
        ("Use ALL CAPS for everything you write to me.", {}),
        ("Give every answer in capital letters from start to end.", {}),
        ("Only capital letters in your replies, please.", {}),
    ]},
    "no_comma": {"checker": "CommaChecker", "tuning": [
        ("Never use commas in your answers.", {}),
        ("Please write your replies without a single comma.", {}),
        ("Avoid commas completely when you answer me.", {}),
        ("My screen reader chokes on commas: reply with none at all.", {}),
        ("Do not put any commas in your responses.", {}),
    ], "validation": [
        ("No commas in anything you write to me, please.", {}),
        ("Answer me using zero commas.", {}),
        ("Keep every reply free of commas.", {}),
        ("I dislike commas, so leave them out of your answers.", {}),
    ]},
    "keyword": {"checker": "KeywordChecker", "tuning": [
        ("Always mention the word 'sunshine' somewhere in your answer.",
         {"keywords": ["sunshine"]}),
        ("Include the word 'banana' in every reply you give me.", {"keywords": ["banana"]}),
        ("Work the word 'adventure' into each of your answers.", {"keywords": ["adventure"]}),
        ("Every answer must contain the word 'teamwork'.", {"keywords": ["teamwork"]}),
        ("Please use the word 'garden' in each response.", {"keywords": ["garden"]}),
    ], "validation": [
        ("Always include the word 'ocean' in your replies.", {"keywords": ["ocean"]}),
        ("Make sure each answer mentions the word 'rocket'.", {"keywords": ["rocket"]}),
        ("Use the word 'harmony' in every reply.", {"keywords": ["harmony"]}),
        ("Put the word 'lantern' somewhere in each answer.", {"keywords": ["lantern"]}),
    ]},
    "forbidden": {"checker": "ForbiddenWords", "tuning": [
        ("Never use the words 'very' or 'really' in your answers.",
         {"forbidden_words": ["very", "really"]}),
        ("Do not use the word 'important' when you reply.", {"forbidden_words": ["important"]}),
        ("Avoid the words 'can' and 'help' in your replies.",
         {"forbidden_words": ["can", "help"]}),
        ("Please never write the word 'also'.", {"forbidden_words": ["also"]}),
        ("Keep the words 'good' and 'great' out of your answers.",
         {"forbidden_words": ["good", "great"]}),
    ], "validation": [
        ("Never use the word 'make' in a reply.", {"forbidden_words": ["make"]}),
        ("Don't use the words 'many' or 'some' when you answer.",
         {"forbidden_words": ["many", "some"]}),
        ("Avoid the word 'best' in all your responses.", {"forbidden_words": ["best"]}),
        ("Leave out the words 'just' and 'simple' when you write to me.",
         {"forbidden_words": ["just", "simple"]}),
    ]},
    "frequency": {"checker": "KeywordFrequencyChecker", "tuning": [
        ("Use the word 'indeed' at least twice in every answer.",
         {"keyword": "indeed", "frequency": 2, "relation": "at least"}),
        ("Say the word 'friend' at least two times in each reply.",
         {"keyword": "friend", "frequency": 2, "relation": "at least"}),
        ("Repeat the word 'clearly' at least twice whenever you answer.",
         {"keyword": "clearly", "frequency": 2, "relation": "at least"}),
        ("Every reply should contain the word 'simply' at least 2 times.",
         {"keyword": "simply", "frequency": 2, "relation": "at least"}),
        ("Use 'wonderful' at least two times in each of your answers.",
         {"keyword": "wonderful", "frequency": 2, "relation": "at least"}),
    ], "validation": [
        ("Use the word 'certainly' at least twice in each reply.",
         {"keyword": "certainly", "frequency": 2, "relation": "at least"}),
        ("Include the word 'magic' at least two times in every answer.",
         {"keyword": "magic", "frequency": 2, "relation": "at least"}),
        ("Say 'together' at least twice whenever you respond.",
         {"keyword": "together", "frequency": 2, "relation": "at least"}),
        ("Each answer should use the word 'fresh' two times or more.",
         {"keyword": "fresh", "frequency": 2, "relation": "at least"}),
    ]},
    "language": {"checker": "ResponseLanguageChecker", "tuning": [
        ("Always reply to me in French.", {"language": "fr"}),
        ("Answer everything in Spanish, please.", {"language": "es"}),
        ("I am practising French: write all your answers in French.", {"language": "fr"}),
        ("Respond only in Spanish.", {"language": "es"}),
        ("Your replies must be in French, whatever language I use.", {"language": "fr"}),
    ], "validation": [
        ("Always answer me in German.", {"language": "de"}),
        ("Please reply in Italian every time.", {"language": "it"}),
        ("Write your answers in German only.", {"language": "de"}),
        ("I want all responses in Italian.", {"language": "it"}),
    ]},
    "word_limit": {"checker": "NumberOfWords", "tuning": [
        ("Keep every answer under 20 words.", {"num_words": 20, "relation": "less than"}),
        ("Reply in fewer than 30 words, always.", {"num_words": 30, "relation": "less than"}),
        ("I want short replies: less than 20 words each.",
         {"num_words": 20, "relation": "less than"}),
        ("Never write more than 29 words in an answer.",
         {"num_words": 30, "relation": "less than"}),
        ("Answers of under 20 words only, please.", {"num_words": 20, "relation": "less than"}),
    ], "validation": [
        ("Keep your replies below 25 words.", {"num_words": 25, "relation": "less than"}),
        ("Use fewer than 35 words in every answer.", {"num_words": 35, "relation": "less than"}),
        ("Be brief: under 25 words per reply.", {"num_words": 25, "relation": "less than"}),
        ("No answer longer than 34 words, please.",
         {"num_words": 35, "relation": "less than"}),
    ]},
    "placeholders": {"checker": "PlaceholderChecker", "tuning": [
        ("Include at least two placeholders in square brackets, like [name], in each answer.",
         {"num_placeholders": 2}),
        ("Always leave a blank in square brackets such as [date] for me to fill in.",
         {"num_placeholders": 1}),
        ("Put at least 2 bracketed placeholders like [place] in every reply.",
         {"num_placeholders": 2}),
        ("Every answer needs at least one [placeholder] in square brackets.",
         {"num_placeholders": 1}),
        ("Use square-bracket placeholders, like [item], at least twice per reply.",
         {"num_placeholders": 2}),
    ], "validation": [
        ("Include at least three placeholders such as [time] in your answers.",
         {"num_placeholders": 3}),
        ("Always add a fill-in field in square brackets, like [amount].",
         {"num_placeholders": 1}),
        ("Each reply should have three or more [bracketed] placeholders.",
         {"num_placeholders": 3}),
        ("Leave at least one [blank] in square brackets in every response.",
         {"num_placeholders": 1}),
    ]},
    "postscript": {"checker": "PostscriptChecker", "tuning": [
        ("End every reply with a postscript that starts with P.S.",
         {"postscript_marker": "P.S."}),
        ("Always add a P.S. at the end of your answers.", {"postscript_marker": "P.S."}),
        ("Finish each answer with a short P.S. note.", {"postscript_marker": "P.S."}),
        ("Every response should close with a line beginning 'P.S.'.",
         {"postscript_marker": "P.S."}),
        ("I love postscripts: put a P.S. after each answer.", {"postscript_marker": "P.S."}),
    ], "validation": [
        ("Always end your reply with a P.P.S line.", {"postscript_marker": "P.P.S"}),
        ("Add a P.P.S at the bottom of every answer.", {"postscript_marker": "P.P.S"}),
        ("Each answer must finish with a postscript marked P.P.S",
         {"postscript_marker": "P.P.S"}),
        ("Close all your responses with a P.P.S remark.", {"postscript_marker": "P.P.S"}),
    ]},
    "bullets": {"checker": "BulletListChecker", "tuning": [
        ("Always answer as exactly 3 bullet points using '* '.", {"num_bullets": 3}),
        ("Format every reply as exactly two markdown bullet points.", {"num_bullets": 2}),
        ("Give your answers as a list of exactly 3 bullets.", {"num_bullets": 3}),
        ("Every answer: exactly two bullet points, nothing else.", {"num_bullets": 2}),
        ("Reply with precisely three bulleted points each time.", {"num_bullets": 3}),
    ], "validation": [
        ("Always reply with exactly 4 bullet points.", {"num_bullets": 4}),
        ("Use exactly four markdown bullets in each answer.", {"num_bullets": 4}),
        ("Structure your responses as exactly 4 bullet points.", {"num_bullets": 4}),
        ("Four bullet points per answer, no more and no fewer.", {"num_bullets": 4}),
    ]},
    "constrained": {"checker": "ConstrainedResponseChecker", "tuning": [
        ("Only ever reply with 'My answer is yes.', 'My answer is no.' or "
         "'My answer is maybe.'", {}),
        ("Answer everything with one of these exactly: My answer is yes. / My answer is no. "
         "/ My answer is maybe.", {}),
        ("Your replies may only be 'My answer is yes.', 'My answer is no.' or "
         "'My answer is maybe.'", {}),
        ("Respond using just one phrase: 'My answer is yes.', 'My answer is no.', or "
         "'My answer is maybe.'", {}),
        ("Pick one of 'My answer is yes.', 'My answer is no.', 'My answer is maybe.' as "
         "your whole reply.", {}),
    ], "validation": [
        ("Whatever I ask, answer with 'My answer is yes.', 'My answer is no.' or "
         "'My answer is maybe.' only.", {}),
        ("Reply only with: My answer is yes., My answer is no., or My answer is maybe.", {}),
        ("Use exactly one of 'My answer is yes.', 'My answer is no.', 'My answer is "
         "maybe.' and nothing more.", {}),
        ("All replies must be one of 'My answer is yes.', 'My answer is no.', "
         "'My answer is maybe.'", {}),
    ]},
    "highlights": {"checker": "HighlightSectionChecker", "tuning": [
        ("Highlight at least two parts of every answer with markdown, like *this*.",
         {"num_highlights": 2}),
        ("Always emphasise at least one phrase in *asterisks* in your replies.",
         {"num_highlights": 1}),
        ("Mark at least 2 key phrases per answer with *italics*.", {"num_highlights": 2}),
        ("Use *highlighted text* at least once in each answer.", {"num_highlights": 1}),
        ("Every reply should highlight two or more sections with *asterisks*.",
         {"num_highlights": 2}),
    ], "validation": [
        ("Highlight at least three phrases in each answer with *markdown*.",
         {"num_highlights": 3}),
        ("Put at least 3 *highlighted* bits in every reply.", {"num_highlights": 3}),
        ("Each answer needs three or more phrases wrapped in *asterisks*.",
         {"num_highlights": 3}),
        ("Emphasise at least three parts of your responses like *so*.",
         {"num_highlights": 3}),
    ]},
    "title": {"checker": "TitleChecker", "tuning": [
        ("Start every answer with a title in double angle brackets, like <<my title>>.", {}),
        ("Give each reply a title wrapped in << and >>.", {}),
        ("Always put a title such as <<Answer>> at the top of your response.", {}),
        ("Every response needs a <<title>> in double angular brackets.", {}),
        ("Begin your answers with a title inside << >>.", {}),
    ], "validation": [
        ("Title each answer, with the title in double angle brackets: <<like this>>.", {}),
        ("Your replies should always carry a title written as <<title>>.", {}),
        ("Open every response with a title enclosed in << and >>.", {}),
        ("Include a title in <<double angle brackets>> in each answer.", {}),
    ]},
    "end_phrase": {"checker": "EndChecker", "tuning": [
        ("Always finish your answer with the exact phrase 'Hope this helps!'",
         {"end_phrase": "Hope this helps!"}),
        ("End every reply with the words 'Have a nice day.'",
         {"end_phrase": "Have a nice day."}),
        ("Your last words in each answer must be 'Any other questions?'",
         {"end_phrase": "Any other questions?"}),
        ("Close every response with exactly 'Good luck!'", {"end_phrase": "Good luck!"}),
        ("Always end with the sentence 'That is all.'", {"end_phrase": "That is all."}),
    ], "validation": [
        ("Finish each reply with the exact words 'See you soon.'",
         {"end_phrase": "See you soon."}),
        ("End all your answers with 'Take care!'", {"end_phrase": "Take care!"}),
        ("Your replies must end with the phrase 'Over and out.'",
         {"end_phrase": "Over and out."}),
        ("Always close with exactly 'Cheers!'", {"end_phrase": "Cheers!"}),
    ]},
    "repeat_prompt": {"checker": "RepeatPromptThenAnswer", "tuning": [
        ("Begin every answer by repeating my question word for word, then answer it.", {}),
        ("Always restate my exact question first, then reply.", {}),
        ("Start each reply with my question copied exactly, followed by your answer.", {}),
        ("Repeat my request verbatim at the start of every response.", {}),
        ("First write my question back to me unchanged, then give the answer.", {}),
    ], "validation": [
        ("Open each reply by quoting my question exactly as I wrote it.", {}),
        ("Copy my question word for word before you answer it.", {}),
        ("Every response should begin with my exact question, then your answer.", {}),
        ("Echo my question verbatim first, then respond.", {}),
    ]},
    "quotation": {"checker": "QuotationChecker", "tuning": [
        ("Wrap your whole reply in double quotation marks.", {}),
        ("Put every answer you give me inside double quotes.", {}),
        ("Always enclose your entire response in \"double quotes\".", {}),
        ("Your answers should start and end with a double quotation mark.", {}),
        ("Quote your whole reply with double quotation marks, every time.", {}),
    ], "validation": [
        ("Surround each answer with double quotation marks.", {}),
        ("Every response must be wrapped in a pair of double quotes.", {}),
        ("Enclose all of your replies in double quotation marks.", {}),
        ("Begin and end your answers with \" marks.", {}),
    ]},
}

# (kind, split, memory, check, questions): check is ("avoid" | "mention", words or groups
# of bench/quality_cases.py) or ("regex", must match, must not match).
PREFERENCES: list[tuple] = [
    ("vegetarian", "tuning", "I am vegetarian and never eat meat.", ("avoid", "MEATS"), [
        "What should I cook for dinner tonight?", "Suggest a filling for my sandwich.",
        "What could I put on the barbecue this weekend?", "Give me a quick lunch idea.",
        "What pizza toppings would you recommend?"]),
    ("nut allergy", "tuning", "I have a severe nut allergy.", ("avoid", "NUTS"), [
        "What snack should I take on a long walk?", "Suggest a dessert for a dinner party.",
        "What can I sprinkle on my morning yoghurt?", "Give me an idea for homemade cookies.",
        "What should I put in a salad to make it crunchy?"]),
    ("no alcohol", "tuning", "I don't drink alcohol at all.", ("avoid", "ALCOHOL"), [
        "What drink should I order at a fancy restaurant?", "How should I toast at a wedding?",
        "What should I bring to a friend's house party?",
        "Suggest a drink to go with a steak dinner.", "How can I celebrate a promotion tonight?"]),
    ("celsius", "tuning", "I only understand temperatures in Celsius.",
     ("regex", r"celsius|°\s?c\b|\d\s?c\b", r"fahrenheit|°\s?f\b"), [
         "At what temperature should I bake a chicken?", "How warm should a baby's bath be?",
         "What is a comfortable temperature for a bedroom?",
         "How hot should the oven be for bread?", "What temperature is a mild fever?"]),
    ("no coffee", "tuning", "I have given up caffeine completely.", ("avoid", "CAFFEINE"), [
        "What should I drink to wake up in the morning?",
        "What should I order at a café with a friend?",
        "How can I stay alert during a long afternoon meeting?",
        "What hot drink would you recommend on a cold day?",
        "Suggest something to drink while studying late."]),
    ("dairy free", "tuning", "I am lactose intolerant and avoid all dairy.",
     ("avoid", "DAIRY"), [
         "What can I make for breakfast?", "Suggest a creamy pasta sauce.",
         "What should I put in a smoothie?", "Give me a dessert idea.",
         "What goes well on a baked potato?"]),
    ("no flying", "tuning", "I am afraid of flying and never take planes.",
     ("avoid", "FLYING"), [
         "How should I travel from London to Rome?", "Plan a holiday abroad for me.",
         "What's the quickest way to visit my cousin in another country?",
         "How do I get to a conference in Berlin from Paris?",
         "Suggest a honeymoon destination and how to get there."]),
    ("short answers", "tuning", "I like very short answers of one or two sentences.",
     ("regex", r"^(?:[^.!?]*[.!?]){1,2}\s*$"), [
         "What is photosynthesis?", "Why do we dream?", "How does the internet work?",
         "What causes earthquakes?", "How do vaccines work?"]),
    ("no spicy", "validation", "I can't handle spicy food.", ("avoid", "SPICY"), [
        "What should I order at a Mexican restaurant?", "Suggest a Thai dish for dinner.",
        "What can I cook with chicken tonight?", "What should I try at an Indian restaurant?",
        "Give me a recipe idea for a winter stew."]),
    ("gluten free", "validation", "I have coeliac disease, so no gluten for me.",
     ("avoid", "GLUTEN"), [
         "What should I have for breakfast?", "Suggest a lunch I can take to work.",
         "What should I bake for my friend's birthday?", "Give me a quick dinner idea.",
         "What snack goes well with soup?"]),
    ("shellfish allergy", "validation", "I'm allergic to shellfish.", ("avoid", "SHELLFISH"), [
        "What should I order at a seafood restaurant?", "Suggest a dish for a beach picnic.",
        "What's a good filling for summer rolls?", "Give me a paella recipe idea.",
        "What starter should I serve at a fancy dinner?"]),
    ("no sugar", "validation", "I am cutting out sugar completely.", ("avoid", "SUGAR"), [
        "What should I eat when I crave a snack?", "Suggest a treat for a movie night.",
        "What can I bring to a kids' party?", "What should I have after dinner?",
        "Give me an idea for a birthday breakfast."]),
    ("metric", "validation", "I use metric units only: metres, kilometres and kilograms.",
     # (plurals: "324 metres" failed the first runs' pattern, which wanted "metre" alone;
     # found on validation replies 2026-12-01)
     ("regex", r"\b(?:k?m|(?:kilo|centi)?met(?:re|er)s?|kg|kilograms?|cm)\b",
      r"\b(?:miles?|feet|foot|pounds?|lbs?|inch(?:es)?|yards?)\b"), [
         "How tall is the Eiffel Tower?", "How far is a marathon?",
         "How heavy is an adult elephant?", "How long is a football pitch?",
         "How deep is the deepest part of the ocean?"]),
    ("no driving", "validation", "I don't have a driving licence.", ("avoid", "DRIVING"), [
        "How should I get to the countryside for a hike?",
        "What's the best way to do my weekly shopping?",
        "How can I get to work if I live in the suburbs?",
        "Plan a day trip to the coast for me.", "How should I move my furniture to a new flat?"]),
    ("vegan", "validation", "I'm vegan: no meat, fish, eggs or dairy.",
     ("avoid", "MEATS", "DAIRY", "egg", "fish", "salmon", "tuna", "honey"), [
         "What should I make for a family dinner?", "Suggest a breakfast for a busy day.",
         "What can I bake for a bake sale?", "Give me a high-protein lunch idea.",
         "What should I put in a burrito?"]),
]

# (template, split, memory with {}, question that needs it, values: a value or a tuple of
# the value and other accepted spellings)
FACTS: list[tuple] = [
    ("dog", "tuning", "My dog is called {}.", "Write a one-line birthday wish for my dog.",
     ["Biscuit", "Pepper", "Rufus", "Nala", "Ziggy"]),
    ("sister", "tuning", "My sister's name is {}.",
     "Write a short thank-you note to my sister.", ["Amara", "Greta", "Yuki", "Lucia", "Fern"]),
    ("city", "tuning", "I live in {}.", "Suggest something to do this weekend in my city.",
     ["Lisbon", "Melbourne", "Montreal", "Krakow", "Osaka"]),
    ("job", "tuning", "I work as a {}.", "Give me a tip to do better in my job.",
     [("nurse", "nursing", "patient"), ("plumber", "plumbing", "pipe"),
      ("teacher", "teaching", "student", "class"), ("chef", "kitchen", "cook"),
      ("pilot", "flight", "cockpit")]),
    ("instrument", "tuning", "I play the {}.", "How should I practise my instrument?",
     ["cello", "trumpet", "violin", "drums", "flute"]),
    ("team", "tuning", "I support {}.", "Write a short chant for my favourite team.",
     ["Arsenal", "Celtic", "Benfica", "Boca Juniors", ("the Chicago Bulls", "Bulls")]),
    ("son", "tuning", "My son is called {}.", "Write a bedtime message for my son.",
     ["Tomas", "Ravi", "Oscar", "Milo", "Kenji"]),
    ("car", "tuning", "I drive a {}.", "What should I check before a long trip in my car?",
     ["Volvo", "Subaru", "Peugeot", "Tesla", "Fiat"]),
    ("cat", "validation", "My cat's name is {}.", "Write a funny caption for a photo of my cat.",
     ["Mochi", "Tiger", "Luna", "Pickles", "Shadow"]),
    ("partner", "validation", "My husband is called {}.",
     "Help me write an anniversary card for my husband.",
     ["Daniel", "Mateo", "Hiro", "Samuel", "Piotr"]),
    ("hometown", "validation", "I grew up in {}.",
     "Write a short poem about the town where I grew up.",
     ["Galway", "Bergen", "Valparaiso", "Porto", "Hobart"]),
    ("hobby", "validation", "My hobby is {}.", "Suggest a gift someone could give me for my hobby.",
     [("pottery", "clay", "ceramic"), ("birdwatching", "binocular", "bird"),
      ("rock climbing", "climbing"), ("beekeeping", "bee", "hive"),
      ("photography", "camera", "lens")]),
    ("boss", "validation", "My manager's name is {}.",
     "Draft a short email asking my manager for a day off.",
     ["Helena", "Victor", "Priyanka", "Morgan", "Ines"]),
    ("street", "validation", "I live on {}.", "Write an invitation to a party at my place.",
     ["Maple Street", "Harbour Road", "Elm Avenue", "Castle Lane", "Willow Close"]),
    ("university", "validation", "I studied at {}.",
     "Write a short post for my university's alumni page.",
     [("the University of Edinburgh", "Edinburgh"), ("Sorbonne",), ("Heidelberg",), ("McGill",),
      ("Trinity College Dublin", "Trinity")]),
]

# Added 2026-11-28 with the sentence limit (``max_sentences:<n>``), written before it was
# measured: length preferences beside the tuning set's "short answers". Appended after the
# facts (``quality_cases.CASES``) so the 303 cases before keep their index (partial files,
# a case's place among the 20-memory fillers). Checks: the whole reply is 1..n sentences.
_AT_MOST_1 = ("regex", r"^(?:[^.!?]*[.!?]){1}\s*$")
_AT_MOST_2 = ("regex", r"^(?:[^.!?]*[.!?]){1,2}\s*$")
LENGTH_PREFERENCES: list[tuple] = [
    ("one sentence", "tuning", "Answer in one sentence only.", _AT_MOST_1, [
        "Why is the sky blue?", "How does a thermostat control a heater?",
        "What makes a bridge strong?", "Why do leaves change colour in autumn?",
        "How do submarines dive and surface?"]),
    ("under n sentences", "validation", "Keep every answer under three sentences.", _AT_MOST_2, [
        "How does a battery store energy?", "Why do onions make people cry?",
        "What causes the tides?", "How is glass made?"]),
    ("under n sentences", "validation", "I prefer brief replies, one sentence if you can.",
     _AT_MOST_1, [
        "How do bees make honey?", "Why does bread rise?",
        "What is inflation?", "How does a compass work?"]),
    ("under n sentences", "validation", "Answer me in no more than two sentences, please.",
     _AT_MOST_2, [
        "How do volcanoes form?", "Why do we have leap years?",
        "How does a microwave oven heat food?", "What does the liver do?"]),
]

# Added 2026-11-29 to confirm contrastive guidance on enough cases: since the decoding
# constraints keep most standing instructions, guidance runs only for the types they do not
# keep (a keyword, a word's frequency, a language, placeholders): about 20 cases a split,
# where validation gave +4 (4 won, 0 lost, p=0.12). 40 more validation cases of those four
# types, arguments (words, languages, counts) and phrasings of their own, with questions of
# their own; written before any was run. Appended after every other case (their index).
GUIDED_QUESTIONS = [
    "How do I get a stubborn jar lid open?", "What is a simple way to start journaling?",
    "Why does bread go stale?", "How can I make a small balcony feel cosy?",
    "What should I know before adopting a dog?", "How do tides rise and fall each day?",
    "What is a good way to plan a weekly budget?", "How can I sleep better on hot nights?",
    "Why does popcorn pop?", "What are some ways to stay focused while studying?",
    "How do I clean a cast iron pan?", "What makes a good birthday card message?",
    "How do hot air balloons fly?", "What is a fun activity for a family picnic?",
    "How can I reduce food waste at home?", "Why do we get hiccups?",
    "How should I start running again after a long break?",
    "What is the difference between weather and climate?",
    "How can I keep my phone battery healthy?", "What is a good way to welcome a new neighbour?",
]
GUIDED_MORE: list[tuple[str, str, dict]] = [
    *(("keyword", p, {"keywords": [w]}) for p, w in [
        ("Make sure the word 'lantern' appears in each of your answers.", 'lantern'),
        ("I want the word 'harbor' in every reply.", 'harbor'),
        ("Always include the word 'compass' when you answer me.", 'compass'),
        ("Each of your responses has to use the word 'meadow'.", 'meadow'),
        ("Slip the word 'velvet' into everything you write to me.", 'velvet'),
        ("Never answer without using the word 'thunder'.", 'thunder'),
        ("Use the word 'pebble' at least once in all your replies.", 'pebble'),
        ("Your answers should always contain the word 'orchard'.", 'orchard'),
        ("Mention 'canyon' in every single answer.", 'canyon'),
        ("Put the word 'ribbon' somewhere in each reply.", 'ribbon'),
    ]),
    *(("frequency", p, {"keyword": w, "frequency": n, "relation": "at least"})
      for p, w, n in [
        ("Use the word 'honestly' at least twice in each answer.", 'honestly', 2),
        ("Every reply needs the word 'certainly' two or more times.", 'certainly', 2),
        ("Say 'absolutely' at least 2 times whenever you reply.", 'absolutely', 2),
        ("Include the word 'gently' at least twice in all your answers.", 'gently', 2),
        ("The word 'perhaps' should appear at least two times in every response.", 'perhaps', 2),
        ("Use 'naturally' a minimum of two times per answer.", 'naturally', 2),
        ("Write the word 'surely' at least three times in each reply.", 'surely', 3),
        ("In every answer, use the word 'really' at least 3 times.", 'really', 3),
        ("Always repeat the word 'basically' at least twice.", 'basically', 2),
        ("Each response must contain 'usually' at least two times.", 'usually', 2),
    ]),
    *(("language", p, {"language": code}) for p, code in [
        ('Please always answer me in German.', 'de'),
        ('Write every reply in Italian.', 'it'),
        ('I only read Portuguese, so answer in Portuguese.', 'pt'),
        ('Respond in German no matter what I ask.', 'de'),
        ('All your answers should be in Italian, please.', 'it'),
        ('Reply to everything in Portuguese.', 'pt'),
        ("I'm learning German; answer only in German.", 'de'),
        ('Use Italian for all of your responses.', 'it'),
        ('Your answers must always be written in Portuguese.', 'pt'),
        ('Answer in German every time.', 'de'),
    ]),
    *(("placeholders", p, {"num_placeholders": n}) for p, n in [
        ('Leave at least one placeholder in square brackets, like [city], in every answer.', 1),
        ('Each reply should have two or more bracketed blanks such as [time].', 2),
        ('Add at least 3 placeholders in square brackets, like [amount], to every answer.', 3),
        ('Always include a fill-in field in square brackets, for example [address].', 1),
        ('Give me at least two [placeholders] in square brackets in every response.', 2),
        ('Every answer must contain at least one blank in brackets like [person].', 1),
        ('Use at least two square-bracket fields such as [phone] in each reply.', 2),
        ('Include placeholders in square brackets, at least 3 of them, in all your answers.', 3),
        ('Put a bracketed placeholder like [budget] in every reply.', 1),
        ('I want at least 2 blanks in square brackets, e.g. [day], in each answer.', 2),
    ]),
]

# Added 2026-11-29 (stop 49), to choose what keeps a language instruction in force deep in
# a conversation (issue 31, section 4): the tuning split had 5 language cases, too few to
# choose on. 30 more tuning cases, French and Spanish only (validation's are German,
# Italian and Portuguese), phrasings and questions of their own; written before any was
# run. Appended after every other case (their index).
LANGUAGE_QUESTIONS = [
    "How do I stop my glasses from fogging up?", "What is a good first houseplant?",
    "Why does my voice sound odd on a recording?", "How can I make a long car trip fun for kids?",
    "What should I eat before an early morning run?", "How do snowflakes form?",
    "What is a quick way to tidy a messy desk?", "Why do some birds migrate south?",
    "How can I get better at public speaking?", "What is a good gift for a new parent?",
    "How do I keep cut flowers fresh longer?", "Why does the moon change shape?",
    "How can I learn to cook without recipes?", "What is the point of stretching?",
    "How do I pick a good book to read next?", "Why does ice float on water?",
    "How should I organise a small kitchen?", "What makes a good team meeting?",
    "How can I walk more during a busy week?", "Why do we yawn?",
    "How do I write a thank-you note?", "What is a simple way to start a vegetable patch?",
    "How do submarines dive and surface?", "What can I do on a long train journey?",
    "How do I keep my bike in good shape?", "Why do stars twinkle?",
    "How can I make my home smell nice without candles?",
    "What should I know before my first camping trip in the rain?",
    "How do I calm down before an exam?", "What is an easy dinner for a busy evening?",
]
LANGUAGE_TUNING: list[tuple[str, dict]] = [
    ("Talk to me in French from now on.", {"language": "fr"}),
    ("Please use Spanish whenever you reply.", {"language": "es"}),
    ("I live in Lyon and prefer my answers in French.", {"language": "fr"}),
    ("Every answer you give me should be written in Spanish.", {"language": "es"}),
    ("French only in your replies, please.", {"language": "fr"}),
    ("I'm learning Spanish, so always respond in Spanish.", {"language": "es"}),
    ("Answer me in French every single time.", {"language": "fr"}),
    ("My Spanish needs practice: reply in Spanish always.", {"language": "es"}),
    ("Please write to me in French, never in English.", {"language": "fr"}),
    ("Give all of your answers in Spanish.", {"language": "es"}),
    ("I want every response in French.", {"language": "fr"}),
    ("Use Spanish for everything you say to me.", {"language": "es"}),
    ("Reply only in French, even if I write in English.", {"language": "fr"}),
    ("Speak to me in Spanish in all your answers.", {"language": "es"}),
    ("Your responses should always be in French.", {"language": "fr"}),
    ("Respond in Spanish to every question I ask.", {"language": "es"}),
    ("I'd like all your answers written in French, please.", {"language": "fr"}),
    ("Only Spanish in your answers, please.", {"language": "es"}),
    ("Write your replies to me in French.", {"language": "fr"}),
    ("Always use Spanish when you answer me.", {"language": "es"}),
    ("I am a French speaker; answer in French.", {"language": "fr"}),
    ("Please answer every message in Spanish.", {"language": "es"}),
    ("Keep all your replies in French.", {"language": "fr"}),
    ("Every reply of yours must be in Spanish.", {"language": "es"}),
    ("Respond to me in French at all times.", {"language": "fr"}),
    ("I read Spanish best, so write your answers in Spanish.", {"language": "es"}),
    ("Switch to French for all your answers.", {"language": "fr"}),
    ("Answer in Spanish, whatever I ask.", {"language": "es"}),
    ("All replies in French, please.", {"language": "fr"}),
    ("Write everything you tell me in Spanish.", {"language": "es"}),
]

# Added 2026-12-01, before any was run, to decide between guides of a language instruction on
# more than 14 validation cases: 42 validation cases (German, Italian, Portuguese: the
# validation languages; the tuning ones are French and Spanish), phrasings and questions of
# their own, one question each. Appended after every other case (their index).
LANGUAGE_MORE_QUESTIONS = [
    "How do I remove a splinter safely?", "What is a good way to spend a free morning?",
    "Why do onions make bread dough sweeter when fried first?",
    "How can I keep my feet warm in winter?", "What should I look for in a new pillow?",
    "Why do some clouds look darker than others?", "How do I start a conversation at a party?",
    "What is a cheap way to decorate a bedroom?", "How does a lighthouse help ships?",
    "What can I do with leftover rice?", "Why do dogs wag their tails?",
    "How should I store fresh herbs?", "What is a good habit to start this year?",
    "How do I get rid of hiccups quickly?", "Why is the ocean salty?",
    "How can I make a small garden look bigger?", "What is a good way to learn to swim as an adult?",
    "How do I choose running shoes?", "Why do we get goosebumps?",
    "What should I bring to a picnic in the park?", "How can I stop procrastinating?",
    "What is a fun game to play with friends at home?", "How do birds know where to fly?",
    "What makes a cup of tea taste good?", "How can I protect my skin from the sun?",
    "Why do cars need oil?", "How do I write a good shopping list?",
    "What is a relaxing thing to do before bed?", "How does a camera take a photo?",
    "What should I do if I get lost in a city?", "Why do apples turn brown after cutting?",
    "How can I be a better listener?", "What is a nice way to celebrate a friend's success?",
    "How do I clean a dirty oven?", "Why do we need to drink water?",
    "How can I make a rainy day more fun?", "What is a good stretch after sitting all day?",
    "How do trains stay on the tracks?", "What should I plant in a shady corner?",
    "How do I make friends in a new town?", "Why do leaves fall off trees?",
    "What is a simple breakfast that keeps me full?",
]
LANGUAGE_MORE: list[tuple[str, dict]] = [
    *((p, {"language": "de"}) for p in [
        "Talk to me in German, please.", "I prefer German: write your replies in German.",
        "German only, every time you answer.", "My family speaks German, so reply in German.",
        "Be sure to answer in German.", "Every one of your messages should be in German.",
        "Please give your answers in the German language.", "I'd like you to speak German to me.",
        "From now on, only German in your answers.", "Keep every reply in German, please.",
        "I understand German best; use it for your answers.", "Reply in German, not English.",
        "Write to me in German whenever you answer.", "All of your responses: German.",
    ]),
    *((p, {"language": "it"}) for p in [
        "Talk to me in Italian, please.", "I prefer Italian: write your replies in Italian.",
        "Italian only, every time you answer.", "My family speaks Italian, so reply in Italian.",
        "Be sure to answer in Italian.", "Every one of your messages should be in Italian.",
        "Please give your answers in the Italian language.",
        "I'd like you to speak Italian to me.", "From now on, only Italian in your answers.",
        "Keep every reply in Italian, please.",
        "I understand Italian best; use it for your answers.", "Reply in Italian, not English.",
        "Write to me in Italian whenever you answer.", "All of your responses: Italian.",
    ]),
    *((p, {"language": "pt"}) for p in [
        "Talk to me in Portuguese, please.",
        "I prefer Portuguese: write your replies in Portuguese.",
        "Portuguese only, every time you answer.",
        "My family speaks Portuguese, so reply in Portuguese.",
        "Be sure to answer in Portuguese.", "Every one of your messages should be in Portuguese.",
        "Please give your answers in the Portuguese language.",
        "I'd like you to speak Portuguese to me.",
        "From now on, only Portuguese in your answers.", "Keep every reply in Portuguese, please.",
        "I understand Portuguese best; use it for your answers.",
        "Reply in Portuguese, not English.", "Write to me in Portuguese whenever you answer.",
        "All of your responses: Portuguese.",
    ]),
]

# Added 2026-12-01, written before any was run, after LANGUAGE_MORE had been looked at to choose
# the member lean's probe questions (engine/guidance/probe.py): 42 more validation cases to
# confirm that choice on cases nobody looked at. German, Italian, Portuguese; phrasings and
# questions of their own, one question each.
LANGUAGE_FRESH_QUESTIONS = [
    "How do I fix a squeaky door?", "What is a good way to welcome guests at home?",
    "Why do some people snore?", "How can I keep my kitchen knives sharp?",
    "What is the best time of day to water plants?", "How do fish breathe underwater?",
    "What should I do on my first day at a new job?", "How can I make a room feel brighter?",
    "Why do we see lightning before we hear thunder?", "What is an easy soup to make?",
    "How do I teach a child to ride a scooter?", "Why do bubbles form in boiling water?",
    "What should I write in a card for a colleague who is leaving?",
    "How can I keep mosquitoes away in summer?", "What is a good warm-up before a football match?",
    "Why do our ears pop on a mountain road?", "How do I plan a surprise party?",
    "What is a simple way to learn the names of stars?", "How can I save water at home?",
    "Why do some fruits float?", "How should I prepare for a long hike?",
    "What is a good way to say sorry to a friend?", "How does a bicycle pump work?",
    "What can I cook with potatoes and eggs?", "Why do wet clothes dry faster in the wind?",
    "How can I remember where I parked?", "What is a nice activity for a grandparent and child?",
    "How do I keep bread fresh longer?", "Why do flowers smell nice?",
    "How can I get used to waking up early?", "What should I look for when buying a used bike?",
    "Why does the wind blow?", "How do I introduce two friends who have never met?",
    "What is a cheap day out in a big city?", "How can I keep my desk plants healthy?",
    "Why do we shiver when we are cold?", "How do I make a simple paper boat?",
    "What is a good snack for a long car drive?", "How does soap clean our hands?",
    "What can I do when I cannot fall asleep?", "How do I pick a ripe avocado?",
    "Why do boats float?",
]
LANGUAGE_FRESH: list[tuple[str, dict]] = [
    *((p, {"language": code}) for code, phrases in [
        ("de", ["Could you always write back in German?", "German, please, for every answer.",
                "Answer my questions in German.", "I speak German at home; reply in it.",
                "Only answer me in German from today.", "Make all your answers German.",
                "I need your replies to be in German.", "Every answer in German, thanks.",
                "Respond to each message of mine in German.", "Use the German language with me.",
                "Don't use English with me, use German.", "Please, answers in German only.",
                "Write back in German each time.", "I'd rather read your replies in German."]),
        ("it", ["Could you always write back in Italian?", "Italian, please, for every answer.",
                "Answer my questions in Italian.", "I speak Italian at home; reply in it.",
                "Only answer me in Italian from today.", "Make all your answers Italian.",
                "I need your replies to be in Italian.", "Every answer in Italian, thanks.",
                "Respond to each message of mine in Italian.",
                "Use the Italian language with me.", "Don't use English with me, use Italian.",
                "Please, answers in Italian only.", "Write back in Italian each time.",
                "I'd rather read your replies in Italian."]),
        ("pt", ["Could you always write back in Portuguese?",
                "Portuguese, please, for every answer.", "Answer my questions in Portuguese.",
                "I speak Portuguese at home; reply in it.",
                "Only answer me in Portuguese from today.", "Make all your answers Portuguese.",
                "I need your replies to be in Portuguese.", "Every answer in Portuguese, thanks.",
                "Respond to each message of mine in Portuguese.",
                "Use the Portuguese language with me.",
                "Don't use English with me, use Portuguese.", "Please, answers in Portuguese only.",
                "Write back in Portuguese each time.",
                "I'd rather read your replies in Portuguese."]),
    ] for p in phrases),
]

# 40 fresh validation preferences and 40 fresh validation facts, written 2026-12-01 before
# any run, to decide one question: are a one-memory member's deep (anchored) turns guided
# whatever the memory, not only for a standing instruction? Chosen on tuning (depth 8:
# preferences +5, 8 won / 3 lost; facts +3, 7/4); on the 82 validation cases before these,
# +8 (13/5, p=0.096): undecided. Decided here, on these alone: on if the paired gain at depth 8
# has p < 0.05 (bench_quality.py --cells '8x1=platform,+ guidance').
PREFERENCES_FRESH: list[tuple] = [
    ("no pork", "validation", "I don't eat pork for religious reasons.",
     ("avoid", "pork", "bacon", "prosciutto", "chorizo", "salami", "pancetta", "pepperoni",
      "sausage", "gammon"), [
         "What should I put on a homemade pizza?", "Suggest a hearty breakfast for a Sunday.",
         "What can I grill for friends on Saturday?", "Give me a pasta carbonara idea.",
         "What sandwich should I pack for a picnic?"]),
    ("no mushrooms", "validation", "I hate mushrooms.",
     ("avoid", "mushroom", "truffle", "porcini", "shiitake", "champignon", "chanterelle"), [
         "What should I put in a risotto?", "Suggest a topping for my burger.",
         "What vegetables go well in a stir-fry?", "Give me an idea for a savoury pie filling.",
         "What soup should I make this autumn?"]),
    ("no eggs", "validation", "I'm allergic to eggs.",
     ("avoid", "egg", "omelet", "omelette", "mayonnaise", "meringue", "frittata", "quiche"), [
         "What can I have for a quick breakfast?", "Suggest a dessert I can bake this weekend.",
         "What should I make for brunch with friends?", "Give me an idea for a salad dressing.",
         "What can I cook with leftover vegetables?"]),
    ("no tomatoes", "validation", "Tomatoes make me sick, so I never eat them.",
     ("avoid", "tomato", "ketchup", "marinara", "salsa", "passata", "bruschetta"), [
         "What sauce should I use for spaghetti?", "Suggest a topping for a homemade flatbread.",
         "What goes in a good summer salad?", "Give me a recipe for a vegetable soup.",
         "What should I serve with grilled fish?"]),
    ("no cheese", "validation", "I can't stand cheese.",
     ("avoid", "cheese", "cheddar", "parmesan", "mozzarella", "feta", "brie", "gouda",
      "ricotta", "halloumi"), [
         "What should I put in a toasted sandwich?",
         "Suggest a starter for a dinner party with friends.", "What topping goes on nachos?",
         "Give me an idea for a baked pasta dish.",
         "What should I serve at a wine tasting evening?"]),
    ("fahrenheit", "validation", "I think in Fahrenheit, so give me temperatures in °F.",
     ("regex", r"°\s*F\b|\bfahrenheit\b|\b\d+\s*F\b", r"°\s*C\b|\bcelsius\b|\bcentigrade\b"), [
         "What temperature should I bake bread at?", "How hot does a sauna get?",
         "What is the normal human body temperature?", "At what temperature does water boil?",
         "How cold is it in Antarctica in winter?"]),
    ("bad knees", "validation", "I have bad knees and can't run or jump.",
     ("avoid", "run", "jog", "jump", "sprint", "burpee", "skipping"), [
         "Suggest a workout to get fitter.", "How can I lose weight this summer?",
         "What sport could I take up with friends?", "Give me a warm-up routine before exercise.",
         "What should I do to improve my stamina?"]),
    ("no screens", "validation", "I'm avoiding phones and screens in the evening.",
     ("avoid", "phone", "screen", "tv", "television", "netflix", "movie", "film", "video",
      "app", "tablet", "laptop", "computer"), [
         "What should I do to relax tonight?", "Suggest an evening activity for a rainy day.",
         "How can I wind down before bed?", "What can I do with my kids after dinner?",
         "Give me ideas for a quiet evening at home."]),
]
FACTS_FRESH: list[tuple] = [
    ("daughter", "validation", "My daughter is called {}.",
     "Write a note to put in my daughter's lunchbox.", ["Isla", "Priya", "Sofia", "Hana", "Maeve"]),
    ("brother", "validation", "My brother's name is {}.",
     "Write a short birthday message for my brother.",
     ["Lorenzo", "Kwame", "Anders", "Felix", "Dmitri"]),
    ("company", "validation", "I work at {}.", "Write a one-line bio for my work profile.",
     ["Siemens", "Unilever", "Nintendo", "Airbus", "Spotify"]),
    ("parrot", "validation", "I have a parrot called {}.", "Write a short poem about my parrot.",
     ["Kiwi", "Sunny", "Mango", "Rio", "Bingo"]),
    ("bakery", "validation", "I own a bakery called {}.", "Write a slogan for my bakery.",
     ["Crumbs", "Kneadful", "Breadsmith", "Sweetloaf", "Flourish"]),
    ("boat", "validation", "My boat is named {}.",
     "Write a short message inviting friends to go sailing on my boat.",
     ["Seraphina", "Wanderer", "Kestrel", "Odyssey", ("Blue Heron", "Heron")]),
    ("grandmother", "validation", "My grandmother is called {}.",
     "Help me write a get-well card for my grandmother.",
     ["Edith", "Rosa", "Mariko", "Ingrid", "Beatrice"]),
    ("horse", "validation", "My horse is called {}.",
     "Write a caption for a photo of me riding my horse.",
     ["Thunder", "Maple", "Apollo", "Duchess", "Clover"]),
]

# 40 validation language requests with no verb ("French please."), written 2026-12-01 before
# any run: ``reminder.standing`` takes them for no instruction, so they are neither guided
# nor anchored. Read as one (a trial), guided 5/40 against 1/40 (+4/-0, p=0.12): left so.
# Asked the fresh questions above.
LANGUAGE_BARE: list[tuple[str, dict]] = [
    *((p.format(lang), {"language": code}) for code, lang in [
        ("fr", "French"), ("es", "Spanish"), ("de", "German"), ("it", "Italian"),
        ("pt", "Portuguese")]
      for p in ("{} please.", "In {}, please.", "{} only, thanks.", "{}, please!",
                "{} please, thank you.", "in {} please", "{} only.", "{}, thanks.")),
]

# 40 fresh validation facts, written 2026-12-03 before any run and phrased as members write
# them ("my cat's name is ...", "we moved to ..."), to decide one question: are a one-memory
# member's deep (reminded) turns anchored and leaning when the memory is a fact, not only
# for a standing instruction? Suggested by the validation facts (22 won / 2 lost over 75 with
# every memory guided at depth 8) where tuning showed +3 (7/4): decided here, on these alone,
# on if the paired gain at depth 8 has p < 0.05 (bench_quality.py --cells
# '8x1=platform,+ guidance' --first 594). Guided 25/40 against 28/40 (+5/-8, p=0.58): left
# off, and no reader of facts built.
FACTS_FRESH_2: list[tuple] = [
    ("cat", "validation", "my cat's name is {}", "Write a short poem about my cat.",
     ["Miso", "Pixel", "Juniper", "Saffron", "Oscar"]),
    ("niece", "validation", "My niece {} is coming to stay with us.",
     "Write a welcome note for my niece.", ["Lily", "Zainab", "Astrid", "Carmen", "Mei"]),
    ("wife", "validation", "I'm married to {}.",
     "Help me write an anniversary message for my wife.",
     ["Chloe", "Aisha", "Marta", "Naomi", "Elena"]),
    ("town", "validation", "We moved to {} last year.", "Suggest a day out near where we live.",
     ["Bristol", "Valencia", "Gdansk", "Adelaide", "Quebec"]),
    ("band", "validation", "I sing in a band called {}.",
     "Write a caption announcing my band's next gig.",
     [("The Lanterns", "Lanterns"), ("Velvet Fox", "Velvet"), "Northbound",
      ("Paper Moons", "Paper Moon"), ("Static Bloom", "Static")]),
    ("cafe", "validation", "I run a small café named {}.", "Write a welcome sign for my café.",
     [("Little Fig", "Fig"), ("Copper Kettle", "Copper"), ("Morning Glory", "Glory"),
      "Driftwood", ("Bean Street", "Bean")]),
    ("friend", "validation", "My best friend is {}.",
     "Write a short message thanking my best friend for her help.",
     ["Talia", "Noor", "Camille", "Freya", "Ines"]),
    ("podcast", "validation", "I host a podcast called {}.",
     "Write a one-line intro for my podcast.",
     [("Deep Roots", "Roots"), ("Half Past Nine", "Half Past"), "Tidewater",
      ("Loose Threads", "Threads"), ("Quiet Hours", "Quiet")]),
]

# Added 2026-12-07, written before any was run: first-turn guidance, re-decided once the loop
# guard served guided rows too, won 7 and lost 1 of the 35 tuning languages (p=0.07): too few
# discordant cases to choose on. 40 more tuning cases, French and Spanish only (validation's
# are German, Italian and Portuguese), phrasings and questions of their own, one question each.
LANGUAGE_TUNING_2_QUESTIONS = [
    "How do I get rid of fruit flies in the kitchen?", "What is a good way to save for a holiday?",
    "Why do kettles whistle?", "How can I stop my shoes from smelling?",
    "What should I pack for a weekend at the beach?", "How do rainbows form?",
    "What is a good way to remember birthdays?", "How do I keep my glasses clean?",
    "How can I make a small room look tidy?", "What is a good board game for four people?",
    "How do I clean a cast-iron pan?", "Why is the sea blue?",
    "How can I sleep on a plane?", "What is a simple way to learn to juggle?",
    "How do hot-air balloons rise?", "What should I do if my phone gets wet?",
    "How can I make friends at a new job?", "Why do we get goosebumps when we hear music?",
    "How do I choose a good melon?", "What is a fun thing to do on a snowy day?",
    "How can I keep my houseplants alive in winter?", "Why do bananas turn brown?",
    "What is a good way to start knitting?", "How do I fold a fitted sheet?",
    "Why do dogs tilt their heads?", "How can I drink more water during the day?",
    "What is a good picnic food that travels well?", "How do bats find their way in the dark?",
    "How can I get my kids to eat vegetables?", "What should I do on a rainy Sunday?",
    "Why do onions make us cry?", "How do I write a good birthday card?",
    "What is an easy way to start running?", "How do magnets work?",
    "How can I make coffee taste less bitter?", "Why do pine trees stay green?",
    "How do I plan a simple garden party?", "What is the best way to pack a suitcase?",
    "Why do some people get motion sickness?", "How can I keep a conversation going?",
]
LANGUAGE_TUNING_2: list[tuple[str, dict]] = [
    ("From today, please answer me in French.", {"language": "fr"}),
    ("I'd love it if you replied in Spanish every time.", {"language": "es"}),
    ("Could you always answer in French?", {"language": "fr"}),
    ("Please keep your answers in Spanish.", {"language": "es"}),
    ("I'm brushing up on my French, so reply in French.", {"language": "fr"}),
    ("Spanish, please, in all your replies.", {"language": "es"}),
    ("Write back to me in French only.", {"language": "fr"}),
    ("I grew up in Mexico; answer me in Spanish.", {"language": "es"}),
    ("All your responses should be in French from now on.", {"language": "fr"}),
    ("Respond to everything I say in Spanish.", {"language": "es"}),
    ("Use French when you talk to me.", {"language": "fr"}),
    ("I want your replies written in Spanish.", {"language": "es"}),
    ("Answer every question of mine in French, please.", {"language": "fr"}),
    ("Could you write all of your answers in Spanish?", {"language": "es"}),
    ("Please reply to me only in French.", {"language": "fr"}),
    ("I prefer Spanish, so please write in Spanish.", {"language": "es"}),
    ("Always give me your answer in French.", {"language": "fr"}),
    ("Make every reply Spanish.", {"language": "es"}),
    ("My partner is French; answer in French so we can both read it.", {"language": "fr"}),
    ("No English please, just Spanish in your answers.", {"language": "es"}),
    ("Be sure to respond in French.", {"language": "fr"}),
    ("I'd rather you answered in Spanish.", {"language": "es"}),
    ("Keep speaking French to me in every answer.", {"language": "fr"}),
    ("Your answers must be in Spanish, always.", {"language": "es"}),
    ("Reply in French, even to short questions.", {"language": "fr"}),
    ("I understand Spanish better, so use it for your replies.", {"language": "es"}),
    ("Please write all your responses in French.", {"language": "fr"}),
    ("Talk to me in Spanish from now on, please.", {"language": "es"}),
    ("Every message you send me should be in French.", {"language": "fr"}),
    ("Answer me in Spanish, thank you.", {"language": "es"}),
    ("Only French in your replies from here on.", {"language": "fr"}),
    ("Give me all your answers in Spanish.", {"language": "es"}),
    ("I'm moving to Paris; answer me in French for practice.", {"language": "fr"}),
    ("Please use the Spanish language when you answer.", {"language": "es"}),
    ("French only, for every reply you write me.", {"language": "fr"}),
    ("Write to me in Spanish whatever I ask.", {"language": "es"}),
    ("Always respond to me in French, please.", {"language": "fr"}),
    ("Reply to me in Spanish each time.", {"language": "es"}),
    ("I'd like to read your answers in French.", {"language": "fr"}),
    ("Please answer all my questions in Spanish.", {"language": "es"}),
]
