"""The hub's row of a server's options is written committed, never left dirty in JupyterHub's
shared session (its handlers roll back a session they find dirty, expiring every object in it)."""

from __future__ import annotations

from types import SimpleNamespace

from jupyterhub import orm

from gpuspawner.hub import storedoptions


def test_the_options_row_is_committed_at_once_and_the_session_left_clean():
    session = orm.new_session_factory("sqlite:///:memory:")()
    user = orm.User(name="ada")
    session.add(user)
    session.commit()
    row = orm.Spawner(name="", user=user)
    session.add(row)
    session.commit()
    spawner = SimpleNamespace(orm_spawner=row, user_options={"offering": "t4-shared", "count": 1})

    storedoptions.store(spawner)

    assert not session.dirty  # a handler finishing now finds nothing to roll back
    session.rollback()  # (as JupyterHub's BaseHandler.finish would): the write is kept
    assert session.query(orm.Spawner).one().user_options == {"offering": "t4-shared", "count": 1}


def test_a_stand_in_row_is_written_without_a_session():
    spawner = SimpleNamespace(orm_spawner=SimpleNamespace(user_options={}), user_options={"offering": "cpu"})
    storedoptions.store(spawner)
    assert spawner.orm_spawner.user_options == {"offering": "cpu"}
