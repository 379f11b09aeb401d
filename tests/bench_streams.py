"""One streaming request after another through the product's event-loop client (bench/stream_client.py ``stream``), on
one keep-alive connection: what the unit tests read a single record with."""
from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stream_client


def streams(endpoint, *requests):
    """The records of ``requests`` (``(prompt, params)`` pairs), sent in turn in one event loop; each reuses the connection
    the one before left open (None after a failure: the next connects again)."""
    async def send_all():
        records, conn = [], None
        for prompt, params in requests:
            record, conn = await stream_client.stream(endpoint, prompt, params, conn)
            records.append(record)
        if conn is not None:
            conn.close()
        return records
    return stream_client.run_loop(send_all)
