"""Speakers written into the content: "Caroline: I went ..." sent as a user turn without a name
ranks, and reads back, as the same turn sent with ``name="Caroline"``."""

from __future__ import annotations

from typing import Any

import pytest

from stratamem import Memory
from stratamem._speakers import speaker_of, speaker_prefix, without_speaker

# content -> the speaker found in it (None: not a speaker label)
PREFIXES = [
    ("Caroline: I went to the LGBTQ support group yesterday.", "Caroline"),
    ("Mary Ann: see you at noon", "Mary Ann"),
    ("Jean-Luc Picard: make it so", "Jean-Luc Picard"),
    ("Leonardo da Vinci: the light is better at dawn", "Leonardo da Vinci"),
    ("O'Brien: the transporter is fixed", "O'Brien"),
    ("Dr. Smith: take two a day", "Dr. Smith"),
    ("Dr. Jane Smith: take two a day", "Dr. Jane Smith"),
    ("José: ¿vamos mañana?", "José"),
    ("Zoë: sounds good", "Zoë"),
    ("Łukasz: jutro", "Łukasz"),
    ("Анна: привет", "Анна"),
    ("  Melanie : Hey Caroline: great news!", "Melanie"),
    # Role labels are found but name no person.
    ("User: I like green tea", None),
    ("Assistant: Sure, here is a recipe.", None),
    ("AI: Noted.", None),
    # Notes, markers, headings, fields, days, meals, pronouns.
    ("Note: buy milk", None),
    ("NOTE: the office is closed", None),
    ("TODO: call the dentist", None),
    ("Correction: I moved to Berlin, not Munich", None),
    ("Re: the trip", None),
    ("Subject: invoice", None),
    ("Monday: gym, Tuesday: swim", None),
    ("Breakfast: eggs and toast", None),
    ("Next Steps: book the flights", None),
    ("Shopping List: eggs, flour", None),
    ("I: am here", None),
    ("The Plan: leave at six", None),
    ("FYI: the meeting moved", None),
    ("Noted: Lisbon since May.", None),  # an acknowledgement
    ("Fun Fact: octopuses have three hearts", None),
    # Not labels at all.
    ("https://example.com: a good site", None),
    ("http://example.com/a:b is down", None),
    ("Meet at 10:30 tomorrow", None),
    ("caroline: lower case is not a name as written", None),
    ("Caroline:no space after the colon", None),
    ("Caroline: ", None),
    ("I think: maybe not", None),
    ("The Big Lebowski Movie Night Club: fun", None),  # too many words
    ("Professional Lyric Video: how to make one", None),  # a title-cased heading
    ("ValueError: Length mismatch", None),
    ("Remember: reply only 'yes'", None),
    ("Role: you are an expert", None),
    ("小明：你好", None),  # no letter case: a label cannot be told from a heading (注意：)
    ("注意：小心", None),
    ("Just a sentence without a label.", None),
]


@pytest.mark.parametrize(("content", "speaker"), PREFIXES)
def test_speaker_prefixes(content: str, speaker: str | None) -> None:
    assert speaker_of(content) == speaker


def test_role_labels_and_stripping() -> None:
    found = speaker_prefix("User: I like tea")
    assert found is not None and found.role and found.label == "User"
    assert without_speaker("Caroline: I went home", "Caroline") == "I went home"
    assert without_speaker("caroline: I went home", "Caroline") == "caroline: I went home"
    assert without_speaker("Caroline: I went home", "Melanie") == "Caroline: I went home"
    assert without_speaker("I went home", "Caroline") == "I went home"
    assert without_speaker("Caroline: I went home", None) == "Caroline: I went home"


# A two-person conversation (turn index, speaker, text), and questions with their evidence.
TURNS = [
    ("Caroline", "Hey Melanie! I went to the LGBTQ support group yesterday, it was powerful."),
    ("Melanie", "That's great, Caroline! I painted a lake at sunrise last week."),
    ("Caroline", "Lovely. I'm researching adoption agencies, I want to give kids a home."),
    ("Melanie", "We went camping in the mountains with the kids, they loved the tent."),
    ("Caroline", "I'm planning to study counseling and mental health next year."),
    ("Melanie", "I signed up for a pottery class, I made a bowl with my daughter."),
    ("Caroline", "My grandmother gave me a necklace from Sweden, it means a lot to me."),
    ("Melanie", "My son loves dinosaurs, we went to the natural history museum."),
]
QUESTIONS = [
    ("What did Melanie paint?", 1),
    ("Where did Melanie go camping?", 3),
    ("What is Caroline researching?", 2),
    ("What did Caroline go to yesterday?", 0),
    ("Who gave Caroline a necklace?", 6),
    ("What class did Melanie sign up for?", 5),
]


def _send(mem: Memory, user_id: str, shape: str) -> None:
    s = mem.sessions.create(user_id=user_id, session_id=f"{user_id}-s1")
    batch: list[Any] = []
    for i, (who, text) in enumerate(TURNS):
        m: dict[str, Any] = {"id": f"{user_id}-{i}", "timestamp": f"2023-05-08T13:{i:02d}:00Z"}
        if shape == "roles":
            m.update(role="user" if who == "Caroline" else "assistant", name=who, content=text)
        else:
            m.update(role="user", content=f"{who}: {text}")
        batch.append(m)
    s.add_messages(batch, sync=True)


def _turns(hits: list[Any]) -> list[int]:
    """The ranking as turn indexes: every hit's messages in rank order, first occurrences."""
    out: list[int] = []
    for h in hits:
        for mid in h.message_ids:
            turn = int(mid.rsplit("-", 1)[1])
            if turn not in out:
                out.append(turn)
    return out


def test_both_shapes_rank_the_evidence_alike(make_memory: Any) -> None:
    mem = make_memory()  # the hashing embedder, the offline pipeline, the backend's store
    _send(mem, "roles", "roles")
    _send(mem, "prefixed", "prefixed")

    # Stored as sent, the speaker found: the same speakers as the named turns.
    stored = mem.messages.get("prefixed-0")
    assert stored.content == f"Caroline: {TURNS[0][1]}" and stored.name == "Caroline"
    assert stored.role == "user"
    for user_id in ("roles", "prefixed"):
        assert mem.store.speaker_names(mem.project_id, user_id) == ["Caroline", "Melanie"]
    # Extraction reads the turn without its label: Caroline's turns give the same facts in
    # both shapes (Melanie's give facts too when every turn is the user's).
    facts = {u: {f.text for f in mem.facts.list(user_id=u)} for u in ("roles", "prefixed")}
    assert facts["roles"] and facts["roles"] <= facts["prefixed"]
    assert not any(":" in text.split()[0] for text in facts["prefixed"])

    for question, evidence in QUESTIONS:
        # The raw turns rank identically: same vectors, same full text, same speaker signal.
        by_shape = {
            u: mem.search(question, user_id=u, layers=["message"], limit=8)
            for u in ("roles", "prefixed")
        }
        assert _turns(by_shape["roles"]) == _turns(by_shape["prefixed"]), question
        assert [round(h.score, 6) for h in by_shape["roles"]] == [
            round(h.score, 6) for h in by_shape["prefixed"]
        ], question
        # Every layer: the evidence is the first turn in both (the prefixed shape has facts
        # of Melanie's turns too, as every turn is the user's).
        for u in ("roles", "prefixed"):
            ranking = _turns(mem.search(question, user_id=u, limit=10))
            assert ranking[0] == evidence, (u, question, ranking)


def test_a_prefixed_turn_reads_back_once_labelled(make_memory: Any) -> None:
    mem = make_memory()
    _send(mem, "prefixed", "prefixed")
    s = mem.sessions.get("prefixed-s1")
    ctx = s.get_memory("Where did Melanie go camping?", recall_config={"message_recent_limit": 2})
    text = ctx.formatted_context
    # Quoted under the fact drawn from it, labelled with its speaker, the label said once.
    assert '> "We went camping in the mountains with the kids' in text
    assert "(Melanie, 2023-05-08)" in text
    assert "Caroline: I'm planning to study counseling" in text
    assert "Melanie: Melanie:" not in text and "Caroline: Caroline:" not in text
    # The name is kept out of full text, as a sent name is: a query of only the name
    # matches no turn by its words.
    hits = mem.search("Melanie", user_id="prefixed", layers=["message"])
    assert all("fulltext" not in h.signals for h in hits)


def test_sent_names_and_labels_that_are_no_speakers_stay_as_they_are(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"id": "a", "role": "user", "content": "Note: I moved to Berlin."},
            {"id": "b", "role": "user", "name": "Caro", "content": "Caroline: hi"},
            {"id": "c", "role": "user", "content": "User: I like green tea."},
            {"id": "d", "role": "user", "content": "Sam: hi", "event_type": "chat_export"},
            {"id": "e", "role": "tool", "content": "Cluster State: healthy"},
            {"id": "f", "role": "assistant", "content": "Case Study: a bakery in Porto."},
            {"id": "g", "role": "user", "content": "Sam: noted, thanks."},
        ],
        sync=True,
    )
    names = [mem.messages.get(i).name for i in "abcdefg"]
    assert names == [None, "Caro", None, None, None, None, "Sam"]
    # A role label on a turn of that role is said once too.
    ctx = s.get_memory("green tea", recall_config={"message_recent_limit": 0})
    assert '> "I like green tea." (user, ' in ctx.formatted_context
    assert "User: I like" not in ctx.formatted_context
