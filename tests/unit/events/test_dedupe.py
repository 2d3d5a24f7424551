import uuid

from events import Deduplicator


def test_duplicate_event_ids_are_recognised_once():
    d = Deduplicator(capacity=3)
    ids = [uuid.UUID(int=i) for i in range(5)]
    assert [d.first_time(i) for i in ids[:3]] == [True, True, True]
    assert d.first_time(ids[1]) is False and d.duplicates == 1
    d.first_time(ids[3])  # evicts the oldest (ids[0])
    assert ids[0] not in d and len(d) == 3
