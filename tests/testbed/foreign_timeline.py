#!/usr/bin/python3
"""The borrowed-bytes timeline of the foreign-traffic test (foreign_test.sh).

  foreign_timeline.py poll URL NIC OUT
      Until killed, reads URL (an agent's /metrics) every 10 ms and appends
      "unix_seconds borrowed_bytes" to OUT: the
      fuselink_nic_transmitted_bytes_total{nic=NIC,traffic="borrowed"} series.
  foreign_timeline.py analyse OUT START STOP CHUNK_S BOUND_S
      START, STOP: unix seconds iperf3 started and was stopped. Prints, as
      key=value lines: before (bytes the NIC's borrowed count grew in the second
      before START), growth_past_bound (growth from START + BOUND_S to STOP),
      give_back_s (START to the last read in which the count still grew before STOP),
      give_back_chunks (give_back_s / CHUNK_S), after (growth after STOP), resumed_s
      (STOP to the first growth after it; -1 if none).
"""
import sys
import time
import urllib.request


def value(body, nic):
    want = 'nic="%s"' % nic
    for line in body.splitlines():
        if line.startswith("fuselink_nic_transmitted_bytes_total{") and want in line \
                and 'traffic="borrowed"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def poll(url, nic, out):
    with open(out, "a", buffering=1) as f:
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    v = value(r.read().decode(), nic)
                if v is not None:
                    f.write("%.6f %.0f\n" % (time.time(), v))
            except OSError:
                pass
            time.sleep(0.01)


def analyse(out, start, stop, chunk_s, bound_s):
    rows = [tuple(map(float, l.split())) for l in open(out) if len(l.split()) == 2]

    def at(t):  # the last read at or before t
        v = rows[0][1]
        for ts, b in rows:
            if ts > t:
                break
            v = b
        return v

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
