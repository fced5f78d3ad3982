"""Calibrated relevance with the real local model: an unrelated query comes back empty and says so,
pinned memories join only when relevant, related queries keep their hits (issue 11, items 2-3)."""

import pytest

import aokun

#: local_mem is shared by the session: these memories stay in their persona
PERSONA = "relevance-test"
MEMORIES = [
    ("Alice drinks an iced americano every morning before work.", {"participants": ["Alice"]}),
    ("Alice is allergic to peanuts.", {"participants": ["Alice"], "pinned": True}),
    ("Bob and Alice are planning a hiking trip to the Alps in July.",
     {"participants": ["Bob", "Alice"]}),
    ("The team moved the weekly standup to Tuesdays at 10.", {"topics": ["work"]}),
    ("老王下周三去杭州出差，记得订高铁票。", {"participants": ["老王"]}),
]


def _store(mem):
    for text, meta in MEMORIES:
        mem.memorize(text, dict(meta, persona_id=PERSONA))


@pytest.mark.slow
def test_an_unrelated_query_returns_nothing_and_says_so(local_mem):
    _store(local_mem)
    out = local_mem.recall("lattice quantum chromodynamics gluon propagator", k=5,
                           persona_id=PERSONA)
    assert out["results"] == []
    assert any(w.startswith("nothing relevant") and "min_relevance" in w
               for w in out["warnings"]), out["warnings"]


def test_pinned_memory_joins_only_when_relevant(local_mem):
    _store(local_mem)
    unrelated = local_mem.recall("what time is the weekly standup", k=5, persona_id=PERSONA,
                                 explain=True)
    texts = [h["text"] for h in unrelated["results"]]
    assert "The team moved the weekly standup to Tuesdays at 10." in texts
    assert "Alice is allergic to peanuts." not in texts  # pinned, but not about the standup
    related = local_mem.recall("what is Alice allergic to", k=5, persona_id=PERSONA)
    assert related["results"][0]["text"] == "Alice is allergic to peanuts."


def test_related_queries_keep_hits_with_a_relevance_on_one_scale(local_mem):
    _store(local_mem)
    cfg = local_mem.cfg.recall
    for query, expected in (("what does Alice drink in the morning", MEMORIES[0][0]),
                            ("where are Bob and Alice going hiking", MEMORIES[2][0]),
                            ("Wang's trip to Hangzhou", MEMORIES[4][0])):  # English about Chinese
        hits = local_mem.recall(query, k=3, persona_id=PERSONA, explain=True)["results"]
        assert hits and hits[0]["text"] == expected, (query, [h["text"] for h in hits])
        for h in hits:
            assert cfg.min_relevance <= h["relevance"] <= 1.0
            explained = h["explain"]["relevance"]
            assert explained == h["relevance"] or abs(explained - h["relevance"]) < 1e-4


def test_min_relevance_zero_keeps_every_hit(local_mem, segmenter):
    _store(local_mem)
    cfg = aokun.Config(None, overrides={("recall", "min_relevance"): 0.0})
    m = aokun.Memory(local_mem.path, cfg, embedder=local_mem.embedder)
    m.seg = segmenter
    try:
        out = m.recall("lattice quantum chromodynamics gluon propagator", k=3, persona_id=PERSONA)
        assert len(out["results"]) == 3 and all(h["relevance"] < 0.4 for h in out["results"])
    finally:
        m.close()


def test_the_script_of_a_question_picks_its_weights(tmp_path):
    assert aokun.query_script(["喜欢", "咖啡"]) == "cjk"
    assert aokun.query_script(["likes", "music"]) == "latin"
    assert aokun.query_script(["python", "教程"]) == "cjk"  # half or more: the Chinese scale
    assert aokun.query_script([]) == "latin"
    rules = tmp_path / "relevance.toml"
    rules.write_text('[anchors]\nlatin = ["a memory"]\n'
                     '["m"]\nw_margin = 1\nw_cover = 2\nbias = 3\n'
                     'margin_only_w = 4\nmargin_only_bias = 5\n'
                     '["m".cjk]\nw_margin = 6\nw_cover = 7\nbias = 8\n',
                     encoding="utf-8")
    ini = tmp_path / "aokun.ini"
    ini.write_text(f"[recall]\nrelevance = {rules}\n", encoding="utf-8")
    r = aokun.Rules(aokun.Config(ini))
    assert r.relevance_coef("m", {"咖啡"})["w_margin"] == 6.0
    assert r.relevance_coef("m", {"咖啡"})["margin_only_w"] == 4.0  # the model's own
    assert r.relevance_coef("m", {"coffee"})["w_margin"] == 1.0
    assert r.anchors == {"latin": ["a memory"]}
    assert r.relevance_coef("other", {"咖啡"}) is None


SMALL_TALK_ZH = ["你好", "谢谢", "讲个笑话"]


def test_chinese_small_talk_returns_nothing(local_mem):
    _store(local_mem)
    for text in ["我最喜欢喝拿铁咖啡，不加糖。", "周末和朋友去爬山了。",
                 "我在一家互联网公司上班。"]:
        local_mem.memorize(text, {"persona_id": PERSONA})
    for query in SMALL_TALK_ZH:
        out = local_mem.recall(query, k=5, persona_id=PERSONA)
        assert out["results"] == [], (query, [(h["text"], h["relevance"]) for h in out["results"]])


def test_chinese_question_words_do_not_outrank_the_content_word(local_mem):
    _store(local_mem)
    for text in ["我最喜欢喝拿铁咖啡，不加糖。", "我下周三去上海出差，想问问哪里好玩。"]:
        local_mem.memorize(text, {"persona_id": PERSONA})
    out = local_mem.recall("我喜欢喝什么咖啡", k=5, persona_id=PERSONA)
    assert out["results"] and "咖啡" in out["results"][0]["text"]
    out = local_mem.recall("我在哪里出差？", k=5, persona_id=PERSONA)
    assert out["results"] and "出差" in out["results"][0]["text"]


#: a week of everyday facts, as an assistant stores them (issue 32): its own persona
SMALL = "relevance-small"
SMALL_MEMORIES = [
    ("User is allergic to penicillin.", {"pinned": True, "topics": ["health"]}),
    ("王芳对花生过敏。", {"participants": ["王芳"]}),
    ("Lin Mei is allergic to shellfish.", {"participants": ["Lin Mei"]}),
    ("我妹妹在杭州一家银行工作。", {"participants": ["妹妹"]}),
    ("下周三上午开预算会议，讨论明年的工作计划。", {"topics": ["工作"]}),
    ("User's cat is named Mochi.", {}),
    ("用户每天早上喝一杯冰美式。", {}),
    ("👍", {}),
    ("🎻🐱", {"topics": ["music", "猫"], "participants": ["Mimi"]}),  # words only in its metadata
    ("……", {}),
    ("42", {}),
]
OFF_TOPIC = ["tell me a joke", "hi", "thanks!", "How do I reverse a list in Python?",
             "What is the capital of France?", "讲个笑话", "你好", "程序员一般几点下班",
             "今天天气怎么样", "Write a short poem about a cat",  # one word of four shared
             "我的电脑很卡怎么办？", "Why do my houseplants keep dying?",  # how-tos about "my" …
             "How do I ask my boss for a raise?",
             "喝咖啡会不会失眠"]  # an A-not-A question: 会不会


@pytest.fixture
def small(local_mem):
    for text, meta in SMALL_MEMORIES:
        local_mem.memorize(text, dict(meta, persona_id=SMALL))
    return local_mem


@pytest.mark.slow
def test_off_topic_questions_of_a_small_memory_come_back_empty(small):
    for query in OFF_TOPIC:
        out = small.recall(query, k=5, persona_id=SMALL)
        assert out["results"] == [], (query, [(h["text"], h["relevance"]) for h in out["results"]])
        assert any(w.startswith("nothing relevant") for w in out["warnings"])


@pytest.mark.slow
def test_a_memory_without_words_is_never_relevant(small):
    for query in ("What's my cat called?", "我每天早上喝什么", "我在学什么乐器？", "thanks!",
                  "你好"):
        out = small.recall(query, k=5, persona_id=SMALL, explain=True)
        for h in out["results"]:
            assert h["text"] not in ("👍", "🎻🐱", "……", "42"), query
    hit = small.recall("What's my cat called?", k=5, persona_id=SMALL)["results"]
    assert hit and hit[0]["text"] == "User's cat is named Mochi."


@pytest.mark.slow
def test_an_everyday_word_shared_is_not_relevance(small):
    hits = small.recall("我妹妹在哪里工作？", k=5, persona_id=SMALL, explain=True)["results"]
    assert hits and hits[0]["text"] == "我妹妹在杭州一家银行工作。"
    assert all("预算" not in h["text"] for h in hits), [(h["text"], h["relevance"]) for h in hits]


@pytest.mark.parametrize("query, names", [
    ("What is Wang Fang allergic to?", {"wang fang"}),
    ("Rachel 是干什么的？", {"rachel"}),
    ("邻居 Gwen 养了什么猫？", {"gwen"}),
    ("Where do I live?", set()),
    ("Tell me about Paris", {"paris"}),
    ("Caroline went hiking", set()),  # the first word of an English question
    ("Hangzhou", {"hangzhou"}),  # capitalised words only: a name search
])
def test_the_names_a_question_gives(query, names):
    assert aokun.query_names(query) == names


def test_a_name_meets_its_memory_by_word_or_by_pinyin(segmenter):
    pinyin = segmenter.pinyin
    assert aokun.names_found({"wang fang"}, {"王芳"}, pinyin, "王芳过敏") == {"wang", "fang"}
    assert aokun.names_found({"wang fang"}, {"wang", "photographer"}, pinyin) == {"wang"}
    assert not aokun.names_found({"wang fang"}, {"user", "allergic", "penicillin"}, pinyin)
    assert not aokun.names_found({"xiaoyu"}, {"王芳", "过敏"}, pinyin, "王芳过敏")
    # a short form of a name, and the name of a short form
    assert aokun.names_found({"mel"}, {"melanie", "pottery"}, pinyin) == {"mel"}
    assert aokun.names_found({"melanie"}, {"mel", "kids"}, pinyin) == {"melanie"}
    assert not aokun.names_found({"mel"}, {"me", "kids"}, pinyin)
    # a Chinese given name alone: Tang Yining asked, 苡宁 stored; 韩小满 asked, Xiaoman stored
    assert aokun.names_found({"tang yining"}, {"苡宁", "门诊"}, pinyin,
                             "苡宁调去疼痛科门诊了") == {"yining"}
    assert aokun.names_found({"韩小满"}, {"xiaoman", "chess"}, pinyin) == {"韩小满"}
    assert not aokun.names_found({"wang fang"}, {"芳芳", "门诊"}, pinyin, "王丽芳去门诊了")


@pytest.mark.parametrize("query, personal", [
    ("Where do I live?", True), ("我妹妹在哪里工作？", True), ("用户住哪", True),
    ("告诉我我住在哪", True), ("How do I get to my sister's place?", True),
    ("tell me a joke", False), ("How do I reverse a list in Python?", False),
    ("帮我写一首诗", False), ("What is the capital of France?", False),
    ("程序员一般几点下班", False), ("hi", False), ("谢谢", False),
    ("business trip next Wednesday", True), ("杭州 出差", True),  # a search by topic
    ("How long should I boil an egg?", False), ("我应该怎么学游泳？", False),  # anyone's how-to
    ("下周五有什么安排？", True),  # the user's plans
    ("What's a good variable name for a list of user IDs?", False),  # "user" a technical word
    ("Where does the user live?", True),
    ("What should I get my wife for her birthday?", True), ("理疗师建议我怎么缓解腰疼？", True),
    ("咖啡喝多了会不会心慌", False), ("感冒了是不是应该多喝水", False),  # A-not-A: questions
    ("我是不是对花生过敏", True),
])
def test_whether_meaning_alone_may_answer_a_question(query, personal):
    assert aokun.Rules(aokun.Config(None)).personal(query) is personal


@pytest.mark.slow
def test_a_question_about_someone_gets_their_fact_not_the_users(small):
    hits = small.recall("What is Wang Fang allergic to?", k=5, persona_id=SMALL)["results"]
    # hers, across languages, when its meaning is close enough; never the user's own
    assert {h["text"] for h in hits} <= {"王芳对花生过敏。"}
    hits = small.recall("林梅对什么过敏？", k=5, persona_id=SMALL)["results"]  # and back
    assert "Lin Mei is allergic to shellfish." in [h["text"] for h in hits]
    hits = small.recall("What am I allergic to?", k=5, persona_id=SMALL)["results"]
    assert hits and hits[0]["text"] == "User is allergic to penicillin."


@pytest.mark.slow
def test_asking_for_plans_of_a_day_finds_them_in_the_other_language(local_mem, monkeypatch):
    """"下周五有什么安排" names no one, but asks for the user's plans: the English plan of that
    day comes back (it came back empty: not about the user, no word shared across scripts)."""
    monkeypatch.setenv("AOKUN_NOW", "2026-12-09T09:00:00Z")  # a Wednesday: 下周五 is the 18th
    for text in ("Dentist appointment on Friday, December 18 at 3 pm.", "User likes oolong tea."):
        local_mem.memorize(text, {"persona_id": "plans"})
    hits = local_mem.recall("下周五有什么安排？", k=3, persona_id="plans")["results"]
    assert [h["text"] for h in hits][:1] == ["Dentist appointment on Friday, December 18 at 3 pm."]
    assert "User likes oolong tea." not in [h["text"] for h in hits]


@pytest.mark.slow
def test_the_user_named_a_participant_is_still_the_user(local_mem):
    """Assistants may send participants ["user"] or ["我"]: the user's own facts stay theirs."""
    for text, who in (("User is allergic to peanuts.", "user"), ("我对猫毛过敏。", "我"),
                      ("Priya is allergic to shellfish.", "Priya Raman"),
                      ("User has a ginger cat called Marmalade.", "user"),
                      ("Gwen has a tabby cat called Pickle.", "Gwen Pritchard")):
        local_mem.memorize(text, {"persona_id": "named", "participants": [who]})
    for query, want, theirs in (
            ("What am I allergic to?", "User is allergic to peanuts.",
             "Priya is allergic to shellfish."),
            ("我对什么过敏？", "我对猫毛过敏。", "Priya is allergic to shellfish."),
            ("What is my cat called?", "User has a ginger cat called Marmalade.",  # her first name
             "Gwen has a tabby cat called Pickle.")):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="named")["results"]]
        assert want in got and theirs not in got, (query, got)


@pytest.mark.slow
def test_questions_as_people_type_them_find_whose_fact_they_ask(local_mem):
    """A name a letter off (Hanah), a possessive without its apostrophe (my sisters job), a
    relative in English inside a Chinese question (我的partner), a short kin word (我弟: 弟弟), a
    name in lower case (aidens, wang zhe: 王哲)."""
    memories = [("User's sister Hannah teaches chemistry in Seattle.", ["Hannah"]),
                ("Hannah is allergic to shellfish.", ["Hannah"]),
                ("User's partner Theo is a nurse at OHSU.", ["Theo"]),
                ("User is allergic to penicillin.", []), ("User works as a backend engineer.", []),
                ("用户的弟弟陈乐在深圳读大学。", ["陈乐"]), ("用户喜欢周末去爬山。", []),
                ("Aiden's band plays the Horseshoe Tavern on 22 November.", ["Aiden"]),
                ("朋友王哲下个月来多伦多找用户玩。", ["王哲"]),
                ("User's mother Carol lives in Sacramento.", ["Carol"])]
    for text, who in memories:
        local_mem.memorize(text, {"persona_id": "typed", "participants": who})
    for query, wanted in (("What is Hanah allergic to?", "Hannah is allergic to shellfish."),
                          ("whats my sisters job", "User's sister Hannah teaches chemistry in "
                                                   "Seattle."),
                          ("我的partner是做什么的", "User's partner Theo is a nurse at OHSU."),
                          ("我弟在哪读书？", "用户的弟弟陈乐在深圳读大学。"),
                          ("when is aidens gig",  # typed in lower case
                           "Aiden's band plays the Horseshoe Tavern on 22 November."),
                          ("when is wang zhe coming to visit", "朋友王哲下个月来多伦多找用户玩。"),
                          ("Where does Mom live?", "User's mother Carol lives in Sacramento.")):
        hits = [h["text"] for h in local_mem.recall(query, k=3, persona_id="typed")["results"]]
        assert hits[:1] == [wanted], (query, hits)
        assert "User works as a backend engineer." not in hits[:1]


@pytest.mark.slow
def test_a_relative_asked_of_finds_the_facts_under_their_name(local_mem):
    """"my wife's birthday": the memories name her (User's wife Carla…, 用户的老婆王婷…)."""
    for text in ("User's wife Carla is a vet.", "Carla's birthday is March 30.",
                 "User's birthday is January 11.", "Milo's school play is on Friday.",
                 "用户的老婆王婷是小学老师。", "王婷的生日是8月21日。", "用户的生日是5月2日。",
                 "我妹妹张悦住在成都。", "Zhang Yue moved to Chongqing in October.",
                 "User moved to Hangzhou in May."):
        local_mem.memorize(text, {"persona_id": "kin"})
    for query, wanted in (("When is my wife's birthday?", "Carla's birthday is March 30."),
                          ("我老婆生日是哪天？", "王婷的生日是8月21日。"),
                          ("我妹妹现在住哪？",  # her name, in pinyin
                           "Zhang Yue moved to Chongqing in October.")):
        hits = [h["text"] for h in local_mem.recall(query, k=3, persona_id="kin")["results"]]
        assert wanted in hits, (query, hits)


@pytest.mark.slow
def test_a_brand_name_or_a_topic_word_alone_is_no_evidence(local_mem):
    """用户的手机是OPPO Find X6 is Chinese (query_script), so Chinese questions of other things
    do not meet it on meaning as if across scripts; a word in a memory's topics alone ("food") is
    no evidence for a question that is not about the user."""
    for text, topics in (("用户的手机是OPPO Find X6。", ["手机"]),
                         ("Switched to soy milk in her coffee.", ["food", "drinks"]),
                         ("用户每周日早上去东海岸公园骑车。", ["运动"])):
        local_mem.memorize(text, {"persona_id": "mx", "topics": topics})
    for query in ("说一个关于程序员的笑话吧。", "我想给部门安排一次团建，有什么推荐的活动？",
                  "What food is high in iron?"):
        assert local_mem.recall(query, persona_id="mx")["results"] == [], query
    for query, wanted in (("我现在用什么手机？", "用户的手机是OPPO Find X6。"),
                          ("What do I put in my coffee?", "Switched to soy milk in her coffee.")):
        hits = [h["text"] for h in local_mem.recall(query, persona_id="mx")["results"]]
        assert wanted in hits, (query, hits)


@pytest.mark.slow
def test_a_how_to_question_does_not_ask_a_slot(local_mem):
    """"How do I get my car ready for winter?" names the car but asks a method, not which car:
    the Chinese car memory is not its answer across scripts (it came back at 0.93 as the car
    slot's value); "What car do I drive?" still gets it."""
    local_mem.memorize("用户的车是一辆大众帕萨特。", {"persona_id": "ht"})
    assert local_mem.recall("How do I get my car ready for winter?", persona_id="ht")[
        "results"] == []
    hits = local_mem.recall("What car do I drive?", persona_id="ht")["results"]
    assert [h["text"] for h in hits] == ["用户的车是一辆大众帕萨特。"]


@pytest.mark.slow
def test_a_search_by_topic_finds_its_memory_in_the_other_language_by_its_words(local_mem):
    """rules/lexicon.toml: "passport expiry" shares no word with 我的护照明年四月到期 and names no
    one, so it had no evidence and came back empty; now its words are met in Chinese (护照, 到期),
    and 健身房 finds the English gym; a general question still gets nothing."""
    for text in ("I work as a nurse in the cardiology ward.", "I go to the gym before my shift.",
                 "I have a dentist appointment on 3 March.", "我的护照明年四月到期。",
                 "最近在学做红烧肉，已经做了三次。"):
        local_mem.memorize(text, {"persona_id": "lexicon"})
    for query, want in (("passport expiry", "我的护照明年四月到期。"),
                        ("健身房", "I go to the gym before my shift.")):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="lexicon")["results"]]
        assert got[:1] == [want], (query, got)
    for query in ("What is the capital of Peru?", "护照丢了怎么补办？"):
        assert local_mem.recall(query, k=3, persona_id="lexicon")["results"] == [], query


@pytest.mark.slow
def test_how_i_usually_do_something_asks_about_me_not_for_instructions(local_mem):
    """"How do I usually get to work?" read as a how-to ("How do I fix my bike?") needed a shared
    word and came back empty; "usually", "these days", "lately" make it a question of the user's
    habit."""
    for text in ("我每天坐地铁去公司，单程四十分钟。", "I'm learning Spanish on Duolingo.",
                 "My sister lives in Leeds."):
        local_mem.memorize(text, {"persona_id": "habits"})
    for query in ("How do I usually get to work?", "How do I get to the office these days?",
                  "How do I get to the office lately?"):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="habits")["results"]]
        assert got[:1] == ["我每天坐地铁去公司，单程四十分钟。"], (query, got)
    assert local_mem.recall("How do I fix a flat tyre?", k=3, persona_id="habits")["results"] == []


@pytest.mark.slow
def test_a_place_in_capitals_is_no_persons_name_and_meets_its_other_spelling(local_mem):
    """"When is the Japan trip?" took Japan for a person the memory must name, so 日本 came back
    empty (found by the trial); rules/aliases.toml's names are places and things, and their other
    language's words are met like the lexicon's."""
    for text in ("用户计划明年四月去日本看樱花，已经订了机票。", "用户的妈妈住在成都。",
                 "The user plays badminton on Tuesdays."):
        local_mem.memorize(text, {"persona_id": "places"})
    for query, want in (("When is the Japan trip?", "用户计划明年四月去日本看樱花，已经订了机票。"),
                        ("Chengdu", "用户的妈妈住在成都。")):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="places")["results"]]
        assert got[:1] == [want], (query, got)


@pytest.mark.slow
def test_a_who_question_of_our_things_gets_the_person_who_does_them(local_mem):
    """"Who … in our office?" speaks of the user but asks for someone else: the memory of another
    person's task was dropped as "not the user's fact"; "What am I allergic to?" still is not
    Priya's."""
    for text, people in (
            ("User's colleague Dmitri Petrov waters the office plants every Friday.",
             ["Dmitri Petrov"]), ("Priya is allergic to cats.", ["Priya"]),
            ("User is allergic to penicillin.", [])):
        local_mem.memorize(text, {"persona_id": "who", "participants": people})
    got = [h["text"] for h in local_mem.recall("Who waters the plants in our office?", k=3,
                                               persona_id="who")["results"]]
    assert got[:1] == ["User's colleague Dmitri Petrov waters the office plants every "
                       "Friday."], got
    got = [h["text"] for h in local_mem.recall("What am I allergic to?", k=3,
                                               persona_id="who")["results"]]
    assert "User is allergic to penicillin." in got and "Priya is allergic to cats." not in got


@pytest.mark.slow
def test_a_relative_named_in_chinese_is_met_by_the_pinyin_of_the_name(tmp_path, segmenter):
    """太太 is a wife; a name jieba does not tag is one of the persona's people (participants);
    the whole name's pinyin meets an English memory (思琪: Siqi; 周明轩: Mingxuan), and such a
    memory is English though its labels are Chinese; in the default persona ('') too, which read
    no relative's name (found trying the README's quick start)."""
    with aokun.Memory(tmp_path / "m.db", aokun.Config(None),
                      embedder=aokun.LocalEmbedder()) as mem:
        mem.seg = segmenter
        for text, people in (("用户的太太叫思琪，在社区医院当护士。", ["思琪"]),
                             ("Siqi got promoted to head nurse!", ["思琪"]),
                             ("我弟弟周明轩在南京读高三，今年六月高考。", ["周明轩"]),
                             ("Mingxuan got 641 in the gaokao.", ["周明轩"]),
                             ("用户的手机是华为Mate 60。", [])):
            mem.memorize(text, {"participants": people})
        for query, want in (("What does my wife do now?", "Siqi got promoted to head nurse!"),
                            ("我弟高考考了多少分？", "Mingxuan got 641 in the gaokao.")):
            got = [h["text"] for h in mem.recall(query, k=3)["results"]]
            assert want in got, (query, got)


@pytest.mark.slow
def test_how_or_why_things_are_asked_of_no_one_is_no_question_of_the_user(local_mem):
    """羽毛球怎么发球…: a question naming no one that asks how or why things are ([personal]
    general) shares badminton with the user's memory, not a fact of theirs: a memory must hold most
    of it (HOW_COVER); 周末一般怎么安排？ asks of the user's habit without a 我."""
    for text in ("用户每周六下午在体育馆打羽毛球。", "I boil two eggs for breakfast every day.",
                 "周末一般睡到十点，下午去公园遛狗。", "My new car is dark blue.",
                 "I drink soy milk in my coffee.", "部门团建取消了，因为预算不够。"):
        local_mem.memorize(text, {"persona_id": "general"})
    for query in ("羽毛球怎么发球才不算犯规？", "猫为什么喜欢踩奶？", "Why is the sky blue?",
                  "How to boil an egg so the yolk stays soft?",
                  "Is oat milk or soy milk better for protein?", "奶茶和咖啡哪个更伤胃？"):
        assert local_mem.recall(query, k=3, persona_id="general")["results"] == [], query
    got = [h["text"] for h in local_mem.recall("团建为什么取消了？", k=3,  # it holds most words
                                               persona_id="general")["results"]]
    assert got[:1] == ["部门团建取消了，因为预算不够。"], got
    got = [h["text"] for h in local_mem.recall("周末一般怎么安排？", k=3,
                                               persona_id="general")["results"]]
    assert got[:1] == ["周末一般睡到十点，下午去公园遛狗。"], got


@pytest.mark.slow
def test_a_recent_memory_of_other_things_does_not_answer_what_holds_now(local_mem):
    """"now" asks for the value that holds now; the newest memory (a redacted password, near
    every "my …" question in meaning) is not that value: the job memories come first (the
    fresh-clone trial's memories; a recency boost for "now" put the password first)."""
    persona, ref = "relevance-now", aokun.now()
    for text, days in (("My daughter Sophie is 7 and is allergic to peanuts.", 6),
                       ("My password for the bank is Tr0ub4dor&3 and my PIN is 4821.", 1),
                       ("我住在曼彻斯特。", 7), ("We moved to Leeds last month.", 1),
                       ("I work at Farfetch as a data analyst.", 220),
                       ("I left Farfetch and started at Critical Software as a senior data "
                        "analyst.", 36)):
        local_mem.memorize(text, {"persona_id": persona,
                                  "timestamp": aokun.iso(ref - aokun.dt.timedelta(days=days))})
    for query in ("Where do I work now?", "我现在在哪里上班？", "What is my job?"):
        hits = local_mem.recall(query, k=3, persona_id=persona)["results"]
        assert "Farfetch" in hits[0]["text"], (query, [h["text"] for h in hits])


@pytest.mark.slow
@pytest.mark.parametrize("home, other, query", [
    ("I live in Leeds with my wife Anna.", "Currently watching a documentary about deep sea fish.",
     "Where do I currently live?"),
    ("我住在深圳南山。", "我现在在咖啡馆里写代码。", "我现在住在哪？")])
def test_a_word_of_the_present_is_no_content(local_mem, home, other, query):
    """"currently", 现在 say when, not what (rules/stopwords.txt): the memory sharing only that
    word does not come first (a new-user trial)."""
    persona, ref = "relevance-now-" + str(len(query)), aokun.now()
    for text, days in ((home, 200), (other, 0)):
        local_mem.memorize(text, {"persona_id": persona,
                                  "timestamp": aokun.iso(ref - aokun.dt.timedelta(days=days))})
    hits = local_mem.recall(query, k=3, persona_id=persona)["results"]
    assert hits[0]["text"] == home, [h["text"] for h in hits]


@pytest.mark.slow
def test_a_fact_of_the_world_is_not_answered_by_a_memory_holding_its_place(local_mem):
    """"What's the capital of Norway?" names Norway, which "Back from Norway…" holds: a question of
    a fact of the world ([personal] general) needs most of its words, a name it gives is not
    enough; the user's own question of that place is still answered."""
    for text in ("Back from Norway. Ida is adorable, and Sindre wants to move to Oslo.",
                 "Wenbo lives in a rented condo in Clementi, Singapore.",
                 "我上个月去了挪威的卑尔根。",
                 "Tom Becker, the user's college friend, works at Google in Zurich.",
                 "User is from Bologna and has lived in Beijing since 2019.",
                 "Planning a ski weekend at Whistler in February.", "用户的羽毛球拍是尤尼克斯的。",
                 "User is allergic to cats."):
        local_mem.memorize(text, {"persona_id": "world"})
    for query in ("What's the capital of Norway?", "What time zone is Singapore in?",
                  "Who invented the condo?", "挪威的首都是哪里？", "What's the weather in Zurich?",
                  "What is Google's stock price today?", "新加坡天气怎么样？",
                  "谷歌的股价是多少？", "北京到上海坐高铁要多久", "Tell me a pun about cats",
                  "How much does a Whistler lift ticket usually cost?", "羽毛球的发球规则是什么？"):
        assert local_mem.recall(query, k=3, persona_id="world")["results"] == [], query
    got = [h["text"] for h in local_mem.recall("When was I in Norway?", k=3,
                                               persona_id="world")["results"]]
    assert "Back from Norway. Ida is adorable, and Sindre wants to move to Oslo." in got, got


@pytest.mark.slow
def test_who_my_boss_is_asks_the_users_slot_not_the_bosss_facts(local_mem):
    """"Who is my boss?" named a [subjects] word (boss), so it was no question of the user's, asked
    no slot and came back empty over "I report to Maria."; the boss is the value asked. And a
    question about a relative is not answered by the user's own fact ("I live in Zurich.")."""
    for query, want, who in (("Who is my boss?", "I report to Maria Keller.", "boss"),
                             ("我的领导是谁？", "我现在向林佩珊汇报。", "boss-zh")):
        for text in (want, "I live in Zurich.", "我每天坐地铁上班。", "陈静的领导是王校长。"):
            local_mem.memorize(text, {"persona_id": who})
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id=who)["results"]]
        assert got == [want], (query, got)  # not 陈静's boss
    local_mem.memorize("My sister Anna is a nurse in Leeds.", {"persona_id": "boss"})
    for query in ("Where does my sister live?", "我妹妹住在哪？"):  # not the user's own home
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="boss")["results"]]
        assert got == ["My sister Anna is a nurse in Leeds."], (query, got)


@pytest.mark.slow
def test_a_slot_question_puts_the_memories_of_other_slots_after_its_own(local_mem):
    """"Where do I work now?" asks the employer: the ways to work, which share work and 上班 with
    it, came first (the Chinese job shares no word with the English question); a memory stating
    another slot of the user than asked (commutes_by) now follows one that fills it."""
    for text in ("用户在一家做外贸的公司当会计，公司在鼓楼区。",
                 "用户上班坐地铁2号线，单程大约40分钟。",
                 "用户跳槽去了一家医疗器械公司做财务主管，公司在仓山区。",
                 "我现在改骑电动车上班了，20分钟就到。", "I live in Fuzhou."):
        local_mem.memorize(text, {"persona_id": "slots"})
    got = [h["text"] for h in local_mem.recall("Where do I work now?", k=3,
                                               persona_id="slots")["results"]]
    assert got[:1] == ["用户跳槽去了一家医疗器械公司做财务主管，公司在仓山区。"], got
    got = [h["text"] for h in local_mem.recall("How do I get to work?", k=3,
                                               persona_id="slots")["results"]]
    assert got[:1] == ["我现在改骑电动车上班了，20分钟就到。"], got


@pytest.mark.slow
def test_advice_for_the_user_is_answered_by_a_fact_of_their_body(local_mem):
    """"What should I avoid ordering at a seafood place?" reads as anyone's question (a request's
    "I") and shares no word with "a shellfish allergy": it came back empty. A fact of the body
    (rules/atoms.toml body) answers a question asking advice for the user by meaning; advice on
    other things still comes back empty."""
    for text in ("The user has a shellfish allergy, especially shrimp and crab.",
                 "I'm lactose intolerant, so I always get soy milk in my coffee.",
                 "I play badminton on Sundays."):
        local_mem.memorize(text, {"persona_id": "advice"})
    for query, want in (("What should I avoid ordering at a seafood place?", "shellfish"),
                        ("What milk should I ask for at the café?", "lactose")):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="advice")["results"]]
        assert got and want in got[0], (query, got)
    for query in ("What should I wear to a job interview?", "Should I learn Rust or Go first?"):
        assert local_mem.recall(query, k=3, persona_id="advice")["results"] == [], query


@pytest.mark.slow
def test_a_change_of_the_way_to_work_is_no_change_of_the_job(local_mem):
    """"现在我开车上班，不坐地铁了" changes the commute; memorize's meaning signal also named the
    new job memory, and recall then put the commute above the job for "Where do I work now?". A
    change from a value (不坐地铁了, instead of cycling) changes no memory not holding it."""
    ids = {}
    for text in ("I work at Tencent in Shenzhen as a UX designer.",
                 "I take Shenzhen Metro Line 1 to work every morning.", "我住在南山区科技园附近",
                 "我已经从腾讯离职了，现在在字节跳动上班", "现在我开车上班，不坐地铁了"):
        ids[text] = local_mem.memorize(text, {"persona_id": "commute"})
    car = ids["现在我开车上班，不坐地铁了"]
    assert [m["id"] for m in car["may_update"]] == [
        ids["I take Shenzhen Metro Line 1 to work every morning."]["id"]], car["may_update"]
    for query in ("Where do I work now?", "我现在在哪上班？"):
        got = local_mem.recall(query, k=3, persona_id="commute")["results"]
        assert got[0]["text"] == "我已经从腾讯离职了，现在在字节跳动上班", (query, got)
        assert all("may_be_replaced_by" not in h for h in got), got


@pytest.mark.slow
def test_a_memory_close_to_every_question_needs_more_than_meaning(local_mem):
    """e5-small puts "My password for the bank is [REDACTED…]" as near to any "my X" question as
    the memory answering it: it came first for "Who is my boss?" (0.66) and was the one answer to
    "what is my favourite colour?" (0.42). On meaning alone, a memory pays for how much nearer to
    ordinary questions it is than the others of its script (HUB_SLACK)."""
    for text in ("My password for the bank is hunter2Secret!", "I work at Contoso as a nurse.",
                 "I report to Maria Keller.", "I live in Zurich.", "My sister lives in Bern.",
                 "I am allergic to shellfish."):
        local_mem.memorize(text, {"persona_id": "hub"})
    for query, want in (("Who is my boss?", ["I report to Maria Keller."]),
                        ("what is my favourite colour?", []),
                        ("Where do I work now?", ["I work at Contoso as a nurse."])):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="hub")["results"]]
        assert got == want, (query, got)
    got = local_mem.recall("What's my bank password?", k=3, persona_id="hub")["results"]
    assert got and "password" in got[0]["text"]


@pytest.mark.slow
def test_a_person_named_with_the_users_relation_to_them_is_not_the_user(local_mem):
    """"Zhang Wei, the user's colleague, lives in Binjiang district…" came first for "Where do I
    live?": "the user's colleague" made it speak of the user. An appositive is the person's."""
    local_mem.memorize("Zhang Wei, the user's colleague, lives in Binjiang district and drives a "
                       "Tesla to work.", {"persona_id": "appos", "participants": ["Zhang Wei"]})
    local_mem.memorize("用户住在杭州西湖区。", {"persona_id": "appos"})
    got = [h["text"] for h in local_mem.recall("Where do I live?", k=3,
                                               persona_id="appos")["results"]]
    assert got == ["用户住在杭州西湖区。"], got


@pytest.mark.slow
def test_a_name_leading_a_memory_is_someone_else_when_the_user_is_i(local_mem):
    """Assistants often send no participants: "Priya is allergic to peanuts." came first for "What
    am I allergic to?" and her move for "How do I get to work?". Where the user's memories say I,
    User or 我, a name leading one is someone else's; where they call the user by a name of their
    own, that name's memories stay the user's."""
    for text in ("I live in Leeds.", "我现在骑电动车上班了。", "Priya is allergic to peanuts.",
                 "Priya moved to Singapore for a new job at Grab.", "Jenny can't eat gluten.",
                 "Dentist moved to Thursday at 3pm."):
        local_mem.memorize(text, {"persona_id": "i"})
    for query in ("What am I allergic to?", "我对什么过敏？", "How do I get to work?",
                  "Can I eat gluten?"):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="i")["results"]]
        assert not {"Priya is allergic to peanuts.", "Jenny can't eat gluten.",
                    "Priya moved to Singapore for a new job at Grab."} & set(got), (query, got)
    got = [h["text"] for h in local_mem.recall("When is my dentist appointment?", k=3,
                                               persona_id="i")["results"]]
    assert got[:1] == ["Dentist moved to Thursday at 3pm."], got  # a word leads it, no name
    for text in ("Maeve lives in Bristol.", "Maeve works as a vet nurse.", "Maeve has a cat.",
                 "Maeve cycles to work.", "Maeve is allergic to penicillin.",
                 "Maeve drinks her coffee black."):
        local_mem.memorize(text, {"persona_id": "maeve"})
    got = [h["text"] for h in local_mem.recall("What am I allergic to?", k=3,
                                               persona_id="maeve")["results"]]
    assert got[:1] == ["Maeve is allergic to penicillin."], got
    for text in ("Dana lives in Leeds.", "Dana works as a nurse.", "I have a cat called Miso.",
                 "Dana cycles to work.", "I drink my coffee black.",
                 "Dana is allergic to penicillin.", "I play tennis on Sundays."):  # named, and I
        local_mem.memorize(text, {"persona_id": "dana"})
    got = [h["text"] for h in local_mem.recall("What am I allergic to?", k=3,
                                               persona_id="dana")["results"]]
    assert got[:1] == ["Dana is allergic to penicillin."], got


@pytest.mark.slow
def test_memory_context_of_a_topic_nothing_answers_says_so(local_mem):
    """A bare "# Relevant memories" heading left the assistant to guess whether it was cut."""
    local_mem.memorize("User is allergic to penicillin.", {"persona_id": "ctx"})
    for topic in ("quantum chromodynamics", "量子色动力学"):
        assert local_mem.memory_context(topic, persona_id="ctx")["text"] == \
            "# Relevant memories\n- none stored about this"
    assert "penicillin" in local_mem.memory_context("my allergies", persona_id="ctx")["text"]


@pytest.mark.slow
def test_a_capitalised_word_the_lexicon_translates_meets_its_chinese(local_mem):
    """"When is the hospital Christmas party?" takes Christmas for a name, which the Chinese memory
    could not hold: it came back empty. The lexicon's 圣诞 is that name in Chinese."""
    for text in ("12月18日（周五）晚上医院圣诞聚会。", "I live in Portland.", "我每天坐地铁上班。"):
        local_mem.memorize(text, {"persona_id": "xmas"})
    for query in ("When is the hospital Christmas party?", "When is the Christmas party?"):
        got = [h["text"] for h in local_mem.recall(query, k=3, persona_id="xmas")["results"]]
        assert got[:1] == ["12月18日（周五）晚上医院圣诞聚会。"], (query, got)


@pytest.mark.slow
def test_a_moved_plan_marks_no_plan_that_only_shares_its_month(local_mem):
    """"The Mount Hood hike… is moved to December 19." marked the Chengdu flight in December
    may_be_replaced_by it (the one concept they shared was December), and joined before it for
    "我们什么时候去成都？". A month, like a weekday, is no shared subject of two plans; nor is a
    liking an event ("我周末喜欢去Forest Park徒步" is no hike the move changes)."""
    for text in ("12月18日（周五）晚上医院圣诞聚会。", "我周末喜欢去Forest Park徒步。",
                 "我们计划12月24日飞成都看妈妈，过完春节再回来。",
                 "Hiking trip to Mount Hood with Tom Becker on December 12, 2026.",
                 "The Mount Hood hike with Tom is moved to December 19."):
        local_mem.memorize(text, {"persona_id": "plans"})
    for query, want in (("我们什么时候去成都？", "我们计划12月24日飞成都看妈妈，过完春节再回来。"),
                        ("周末我喜欢做什么？", "我周末喜欢去Forest Park徒步。")):
        hits = local_mem.recall(query, k=3, persona_id="plans")["results"]
        assert hits[0]["text"] == want and "may_be_replaced_by" not in hits[0], (query, hits)
    hits = local_mem.recall("When is the Mount Hood hike?", k=3, persona_id="plans")["results"]
    assert [h["text"] for h in hits][:2] == [
        "The Mount Hood hike with Tom is moved to December 19.",
        "Hiking trip to Mount Hood with Tom Becker on December 12, 2026."], hits


@pytest.mark.slow
def test_a_question_of_a_day_gets_that_days_memories_at_a_relevance_small_talk_none(
        local_mem, monkeypatch):
    """The memories of the day a question asks come back with a relevance that says so (it was null
    or 0.04, under min_relevance); the day after a window is not in it (下周五, the 18th, took the
    19th's hike); small talk and the date of today are no question of the user's days."""
    monkeypatch.setenv("AOKUN_NOW", "2026-12-07T20:00:00Z")
    local_mem.memorize("I had dinner with Tom at a hotpot place.", {"persona_id": "days"})
    monkeypatch.setenv("AOKUN_NOW", "2026-12-08T09:00:00Z")  # a Tuesday
    for text in ("12月19日和Priya去爬山。", "下周五要去医院体检。", "User is allergic to nuts."):
        local_mem.memorize(text, {"persona_id": "days"})
    least = local_mem.cfg.recall.min_relevance
    for query, expect in (("What am I doing on December 19?", "12月19日和Priya去爬山。"),
                          ("What did I do yesterday?", "I had dinner with Tom at a hotpot place."),
                          ("下周五有什么安排？", "下周五要去医院体检。")):
        hits = local_mem.recall(query, k=3, persona_id="days")["results"]
        assert hits and hits[0]["text"] == expect, (query, hits)
        assert all(h["relevance"] is not None and h["relevance"] >= least for h in hits), hits
        assert "12月19日和Priya去爬山。" not in [h["text"] for h in hits[1:]], query
    for query in ("How are you doing today?", "你今天怎么样？", "How was your weekend?",
                  "What day is it today?", "今天几号？", "What's 17 times 23?", "3加5等于几？"):
        assert local_mem.recall(query, k=3, persona_id="days")["results"] == [], query


@pytest.mark.slow
def test_a_plan_change_names_its_plan_not_a_fact_sharing_the_users_city(local_mem, monkeypatch):
    """Where the user lives is in five memories: a cancelled dinner in Hangzhou named the partner's
    job in 杭州 as what it may update. A year-long date (今年59岁) is no plan of December 19; a
    range written "December 24 to 27" is Christmas's; "next Monday" finds its plan."""
    monkeypatch.setenv("AOKUN_NOW", "2026-12-08T09:00:00Z")  # a Tuesday
    for text in ("周屿是用户的伴侣，是一名录音师，在杭州一家叫“回声”的录音棚工作。",
                 "I live in Xihu District, Hangzhou, with my partner Zhou Yu.",
                 "New Year's Eve: concert at Hangzhou Grand Theatre with Zhou Yu.",
                 "I take Hangzhou metro Line 2 to work.", "我最喜欢的杭州菜是西湖醋鱼。",
                 "我妈妈方慧兰住在绍兴，是退休的中学语文老师，今年59岁。",
                 "何晓棠的糖月烘焙店12月19日办三周年店庆，用户答应去帮忙布置甜品台。",
                 "User and Zhou Yu are going to Kyoto from December 24 to 27, 2026.",
                 "团子12月14日上午去瑞派宠物医院打疫苗。",
                 "Dinner with Mira this Friday at 7pm — she's in Hangzhou for a conference."):
        local_mem.memorize(text, {"persona_id": "city"})
    out = local_mem.memorize("Friday's dinner with Mira is cancelled — her conference trip to "
                             "Hangzhou was called off.", {"persona_id": "city"})
    assert [h["preview"][:6] for h in out["may_update"]] == ["Dinner"], out["may_update"]

    def first(query):
        return [h["text"][:6] for h in local_mem.recall(query, k=5, persona_id="city")["results"]]
    assert first("What am I doing on December 19?") == ["何晓棠的糖月"]
    assert first("What are my plans for Christmas?")[:1] == ["User a"]
    assert "团子12月1" in first("What's on next Monday?")
    for query in ("Will it rain in Hangzhou tomorrow?", "把 good morning 翻译成中文"):
        assert first(query) == [], query


@pytest.mark.slow
def test_a_friend_named_before_an_apposition_or_a_chinese_verb_is_the_subject(local_mem):
    """A friend named before an apposition ("Kenji Mori, a … friend, lives in Suzhou") or before
    a Chinese verb ("Kenji Mori 搬到景德镇了") is the slot's subject: no answer to "Where do I
    live?", and the move names his old home as what it updates."""
    for text in ("User's name is Lin Qiao; she is 34 years old.", "我养了一只猫叫团子，三岁。",
                 "I live in Xihu District, Hangzhou.",
                 "Kenji Mori, a Japanese ceramicist friend, lives in Suzhou and runs a kiln."):
        local_mem.memorize(text, {"persona_id": "pets"})
    hits = [h["text"] for h in local_mem.recall("Where do I live?", k=3,
                                                persona_id="pets")["results"]]
    assert hits == ["I live in Xihu District, Hangzhou."], hits
    out = local_mem.memorize("Kenji Mori 搬到景德镇了，租了一个更大的窑。", {"persona_id": "pets"})
    assert [h["preview"][:5] for h in out["may_update"]] == ["Kenji"], out["may_update"]
    got = local_mem.rules.slot("Zhou Yu quit the Echo recording studio and now freelances as a "
                               "sound designer.")
    assert got[0] == "job_title" and got[2] == "zhou yu", got


@pytest.mark.slow
def test_a_place_whose_english_name_is_not_its_pinyin_meets_its_chinese(local_mem):
    """"Harbin" is not the pinyin of 哈尔滨 (haerbin), nor "Kyoto" of 京都: rules/aliases.toml says
    they are one place (the question came back empty at 0.39)."""
    for text in ("我和若川约好了1月22日到24日去哈尔滨看冰雪大世界。", "用户下个月去京都玩。",
                 "I live in Hangzhou."):
        local_mem.memorize(text, {"persona_id": "places"})
    for query, expect in (("When am I going to Harbin?", "我和若川"), ("When is the Kyoto trip?",
                                                                    "用户下个月去")):
        hits = local_mem.recall(query, k=3, persona_id="places")["results"]
        assert [h["text"][:len(expect)] for h in hits[:1]] == [expect], (query, hits)


@pytest.mark.slow
def test_family_asks_of_every_relative(local_mem):
    """memory_context(topic="family") said none was stored though the user's mother and brother
    were: "family" (家人) is asked of every relative, not of the word alone."""
    for text in ("User's younger brother Shen Ruochuan is a PhD student in Chengdu.",
                 "My mom is a retired teacher in Shaoxing.", "My laptop is a MacBook Pro."):
        local_mem.memorize(text, {"persona_id": "family"})
    text = local_mem.memory_context(topic="family", persona_id="family")["text"]
    assert "brother" in text and "mom" in text and "laptop" not in text, text
    # a memory led by "Family" is the user's family's, the user's too (it was someone else's)
    local_mem.memorize("Family summer holiday booked: a week in Brittany from August 9.",
                       {"persona_id": "family"})
    hits = local_mem.recall("暑假我们全家去哪儿度假？", k=3, persona_id="family")["results"]
    assert [h["text"][:6] for h in hits[:1]] == ["Family"], hits


@pytest.mark.slow
def test_a_memory_of_today_matching_half_a_question_stays_below_the_old_fact(local_mem,
                                                                            monkeypatch):
    """Recency counts × the match: "Friday's dinner with Mira is cancelled", written today, came
    first for "Is Mira vegetarian?" above "Mira is vegetarian…" of two months ago."""
    monkeypatch.setenv("AOKUN_NOW", "2026-10-06T19:00:00Z")
    for text in ("Mira is vegetarian and doesn't drink alcohol.", "我对青霉素过敏。",
                 "User takes levothyroxine 50 μg every morning for hypothyroidism."):
        local_mem.memorize(text, {"persona_id": "recent"})
    monkeypatch.setenv("AOKUN_NOW", "2026-12-08T09:00:00Z")
    for text in ("Friday's dinner with Mira is cancelled — her trip was called off.",
                 "My levothyroxine dose was raised to 75 μg after last week's blood test."):
        local_mem.memorize(text, {"persona_id": "recent"})
    for query, expect in (("Is Mira vegetarian?", "Mira is"),
                          ("What am I allergic to?", "我对青霉素")):
        hits = local_mem.recall(query, k=3, persona_id="recent")["results"]
        assert [h["text"][:len(expect)] for h in hits[:1]] == [expect], (query, hits)
