"""The local scorer on hand-made candidates: one signal at a time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stratamem.recall._scoring import Candidate, Key, ScorerWeights, score

Q: Key = ("message", 1)  # Ann: "Where did you go on that road trip?"
A: Key = ("message", 2)  # Bob: "We drove up the coast."
LATER: Key = ("message", 3)  # Ann: "Nice!"
OTHER: Key = ("message", 4)  # Bob, another session, as relevant as the answer


def _turns(*, asked: bool) -> dict[Key, Candidate]:
    def turn(key: Key, cos: float, name: str, session: str = "trip") -> Candidate:
        return Candidate(key=key, vector=(cos,), session=session, name=name)

    cands = {
        Q: turn(Q, 0.9, "Ann"),
        A: turn(A, 0.5, "Bob"),
        LATER: turn(LATER, 0.1, "Ann"),
        OTHER: turn(OTHER, 0.5, "Bob", session="work"),
    }
    cands[Q].next, cands[A].prev = A, Q
    cands[A].next, cands[LATER].prev = LATER, A
    cands[Q].asked = asked
    return cands


# Only the vector side and the answered-question weights: every other signal off.
PLAIN = ScorerWeights(fulltext=0.0, context=0.0, neighbour=0.0, session=0.0, topic=0.0, recency=0.0)


def test_a_question_answered_in_the_next_turn_gives_way_to_its_answer() -> None:
    """The question keeps ``asked`` of its score; its answer gains ``answer`` x the
    question's base relevance, and so passes a turn as relevant as it elsewhere."""
    before = score(_turns(asked=False), weights=PLAIN)
    after = score(_turns(asked=True), weights=PLAIN)
    assert after[Q] == pytest.approx(PLAIN.asked * before[Q])
    assert after[A] == pytest.approx(before[A] + PLAIN.answer * before[Q])
    assert before[A] == pytest.approx(before[OTHER])
    assert after[A] > after[OTHER] == pytest.approx(before[OTHER])
    assert after[LATER] == pytest.approx(before[LATER])


def test_the_weights_turn_the_signal_off() -> None:
    off = replace(PLAIN, asked=1.0, answer=0.0)
    assert score(_turns(asked=True), weights=off) == pytest.approx(
        score(_turns(asked=False), weights=off)
    )


def test_an_answer_that_is_not_a_candidate_gains_nothing() -> None:
    cands = _turns(asked=True)
    del cands[A]
    cands[LATER].prev = None
    plain = _turns(asked=False)
    del plain[A]
    plain[LATER].prev = None
    # Without its answer among the candidates the question keeps its score too.
    assert score(cands, weights=PLAIN) == pytest.approx(score(plain, weights=PLAIN))
