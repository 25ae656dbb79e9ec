#!/usr/bin/python3
"""The borrowed-bytes timeline of the foreign-traffic test (foreign_test.sh).

  foreign_timeline.py poll URL NIC OUT
      Until killed, reads URL (an agent's /metrics) every 10 ms and appends
      "unix_seconds borrowed_bytes foreign_tx_bytes" to OUT: the
      fuselink_nic_transmitted_bytes_total{nic=NIC,traffic="borrowed"} and
      fuselink_nic_foreign_bytes_total{nic=NIC,direction="tx"} series.
  foreign_timeline.py analyse OUT LAUNCH STOP CHUNK_S BOUND_S
      LAUNCH: unix seconds before iperf3 was launched; STOP: after it exited.
      The start (T0) is when iperf3 was sending: the last read before the NIC's
      foreign count first grew after LAUNCH (LAUNCH itself if it never grew). Not
      LAUNCH: on a loaded machine `ip netns exec`, iperf3's start and its connection
      can take longer than the bound. Prints, as key=value lines: start_lag_s (LAUNCH
      to T0), before (bytes the NIC's borrowed count grew in the second before T0),
      growth_past_bound (growth from T0 + BOUND_S to STOP), give_back_s (T0 to the
      last read in which the count still grew before STOP), give_back_chunks
      (give_back_s / CHUNK_S), after (growth after STOP), resumed_s (STOP to the
      first growth after it; -1 if none).
"""
import sys
import time
import urllib.request


def value(body, family, nic, label):
    want = 'nic="%s"' % nic
    for line in body.splitlines():
        if line.startswith(family + "{") and want in line and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def poll(url, nic, out):
    with open(out, "a", buffering=1) as f:
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    body = r.read().decode()
                v = value(body, "fuselink_nic_transmitted_bytes_total", nic,
                          'traffic="borrowed"')
                foreign = value(body, "fuselink_nic_foreign_bytes_total", nic,
                                'direction="tx"')
                if v is not None and foreign is not None:
                    f.write("%.6f %.0f %.0f\n" % (time.time(), v, foreign))
            except OSError:
                pass
            time.sleep(0.01)


def analyse(out, launch, stop, chunk_s, bound_s):
    rows = [tuple(map(float, l.split())) for l in open(out) if len(l.split()) == 3]

    def at(t, column=1):  # the last read at or before t
        v = rows[0][column]
        for row in rows:
            if row[0] > t:
                break
            v = row[column]
        return v

    start = launch
    flat = at(launch, 2)
    for i, row in enumerate(rows):
        if launch < row[0] <= stop and row[2] > flat:
            start = max(launch, rows[i - 1][0]) if i > 0 else launch
            break
    rows = [row[:2] for row in rows]

    last_growth = start
    prev = at(start)
    for ts, b in rows:
        if start < ts <= stop:
            if b > prev:
                last_growth = ts
            prev = b
    first_after = -1
    prev = at(stop)
    for ts, b in rows:
        if ts > stop and b > prev:
            first_after = ts - stop
            break
    give_back = last_growth - start
    print("reads=%d" % len(rows))
    print("start_lag_s=%.3f" % (start - launch))
    print("before=%.0f" % (at(start) - at(start - 1)))
    print("give_back_s=%.3f" % give_back)
    print("give_back_chunks=%.1f" % (give_back / chunk_s))
    print("growth_past_bound=%.0f" % (at(stop) - at(start + bound_s)))
    print("after=%.0f" % (rows[-1][1] - at(stop)))
    print("resumed_s=%.3f" % first_after)


if __name__ == "__main__":
    if sys.argv[1] == "poll":
        poll(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "analyse":
        analyse(sys.argv[2], *map(float, sys.argv[3:7]))
    else:
        sys.exit(__doc__)
