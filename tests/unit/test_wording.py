"""The words a waiting spawn is told (gpuspawner.core.wording)."""


def test_turn_words_tell_the_first_waiting_it_is_theirs_and_when():
    from gpuspawner.core.wording import turn_words

    assert turn_words("MIG 1g.10gb", 1, 130) == "An idle MIG 1g.10gb will be reclaimed for you in about 2 minutes."
    assert turn_words("MIG 1g.10gb", 1, 40) == "An idle MIG 1g.10gb will be reclaimed for you in about a minute."
    assert turn_words("MIG 1g.10gb", 1, -3) == "An idle MIG 1g.10gb will be reclaimed for you now."
    assert turn_words("H100", 3, 600) == "An idle H100 will be reclaimed in about 10 minutes; you are number 3 in the queue."
