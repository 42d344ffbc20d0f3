"""aim serve's throughput with and without dynamic batching, and its overhead per request.

    python3 tests/bench/serve_bench.py AIM MODELS_DIR [--clients 16] [--seconds 10] [--threads N]

For mlp_batch and bert_l6_batch (symbolic batch dims), on loopback:
- throughput (requests/s) and p50/p99 latency of C concurrent clients (separate processes,
  each a kept-alive connection sending one binary-extension request encoded once, so that
  the server, not the client, is measured) against `aim serve --max-batch-size 0` and against
  dynamic batching (max batch C, 2 ms window), and their ratio;
- one client's (Triton's HTTP client) median latency per request, binary and JSON, against `aim bench`'s median
  for the same model and threads: the server's overhead per request.
Prints one table. The clients share the machine with the server: on a 2-core machine they
take CPU the server would otherwise use, in both configurations alike.
"""
import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

from side_by_side import cpu_name


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(aim, model, path, extra):
    port, gport, mport = free_port(), free_port(), free_port()
    p = subprocess.Popen([aim, "serve", "--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(gport),
                          "--metrics-port", str(mport), "--model", f"{model}={path}", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status == 200:
                return p, port, mport
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("aim serve did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(60)


def make_inputs(feeds, binary):
    import tritonclient.http as triton
    ins = []
    for name, a in feeds.items():
        i = triton.InferInput(name, list(a.shape), {np.float32: "FP32", np.int64: "INT64"}[a.dtype.type])
        i.set_data_from_numpy(a, binary_data=binary)
        ins.append(i)
    return ins


def raw_request(model, feeds):
    """A binary-extension request, encoded once: JSON header then the tensors' bytes."""
    dt = {np.float32: "FP32", np.int64: "INT64"}
    head = json.dumps({"inputs": [{"name": n, "shape": list(a.shape), "datatype": dt[a.dtype.type],
                                   "parameters": {"binary_data_size": a.nbytes}} for n, a in feeds.items()],
                       "parameters": {"binary_data_output": True}}).encode()
    body = head + b"".join(np.ascontiguousarray(a).tobytes() for a in feeds.values())
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + body


def raw_client(args):
    """One lean client process (a kept-alive socket, the request encoded once, so the
    server rather than the client is what is measured): requests back to back until the
    deadline; returns latencies (s)."""
    port, model, feeds, deadline = args
    req = raw_request(model, feeds)
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    lat = []
    while time.time() < deadline:
        t = time.perf_counter()
        s.sendall(req)
        while b"\r\n\r\n" not in buf:
            buf += s.recv(1 << 20)
        head, _, buf = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        n = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
        while len(buf) < n:
            buf += s.recv(1 << 20)
        buf = buf[n:]
        lat.append(time.perf_counter() - t)
    s.close()
    return lat


def client(args):
    """One client process: requests back to back until the deadline; returns latencies (s)."""
    port, model, feeds, deadline, binary = args
    import tritonclient.http as triton
    c = triton.InferenceServerClient(f"127.0.0.1:{port}")
    ins = make_inputs(feeds, binary)
    outs = None if binary else []
    lat = []
    while time.time() < deadline:
        t = time.perf_counter()
        r = c.infer(model, ins, outputs=outs)
        r.get_response()
        lat.append(time.perf_counter() - t)
    return lat


def cpu_seconds(pid):
    """CPU time (user + system) a process has used."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def load(pid, port, model, feeds, clients, seconds):
    """Throughput, p50 and p99 (ms), and the server's CPU time per request (us)."""
    # Warm up: every batch size's program compiled before timing.
    # Spawned, not forked: the client library (gevent) does not survive a fork.
    with mp.get_context("spawn").Pool(clients) as pool:
        pool.map(raw_client, [(port, model, feeds, time.time() + 2.0)] * clients)
        start, cpu = time.time(), cpu_seconds(pid)
        lats = pool.map(raw_client, [(port, model, feeds, start + seconds)] * clients)
        wall, cpu = time.time() - start, cpu_seconds(pid) - cpu
    all_lat = np.concatenate([np.array(x) for x in lats]) * 1e3
    n = len(all_lat)
    return n / wall, np.percentile(all_lat, 50), np.percentile(all_lat, 99), cpu / n * 1e6


def metric(mport, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + "{"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("aim")
    ap.add_argument("models")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    threads = ["--threads", str(a.threads)] if a.threads else []
    rows = []
    for model in ["mlp_batch", "bert_l6_batch"]:
        path = os.path.join(a.models, model + ".onnx")
        feeds = dict(np.load(os.path.join(a.models, model + ".inputs.npz")))
        res = {}
        for label, extra in [("unbatched", ["--max-batch-size", "0"]),
                             ("batched", ["--max-batch-size", str(a.clients), "--max-queue-delay-us", "2000"])]:
            p, port, mport = start(a.aim, model, path, threads + extra)
            try:
                res[label] = load(p.pid, port, model, feeds, a.clients, a.seconds)
                res[label] += (metric(mport, "nv_inference_count") / max(metric(mport, "nv_inference_exec_count"), 1),)
            finally:
                stop(p)
        # One client: the server's overhead per request over aim bench's latency.
        p, port, mport = start(a.aim, model, path, threads + ["--max-batch-size", "0"])
        try:
            single = {}
            for binary in (True, False):
                client((port, model, feeds, time.time() + 1.0, binary))
                single[binary] = np.median(client((port, model, feeds, time.time() + min(a.seconds, 5), binary))) * 1e3
        finally:
            stop(p)
        b = subprocess.run([a.aim, "bench", path, "--inputs", os.path.join(a.models, model + ".inputs.npz"),
                            "--iters", "200", "--json", *threads], capture_output=True, text=True, check=True)
        bench = json.loads(b.stdout.strip().splitlines()[-1])["latency_ms"]["median"]
        rows.append((model, res, single, bench))
    print(f"\n{a.clients} concurrent clients (processes, kept-alive raw HTTP, binary tensors), {a.seconds:.0f} s each; "
          f"CPU: {cpu_name()}, {os.cpu_count()} cores")
    print(f"{'model':<15}{'config':<11}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'server CPU us/req':>19}{'rows/run':>10}")
    for model, res, _, _ in rows:
        for label in ("unbatched", "batched"):
            r = res[label]
            print(f"{model:<15}{label:<11}{r[0]:>9.1f}{r[1]:>9.2f}{r[2]:>9.2f}{r[3]:>19.1f}{r[4]:>10.2f}")
        print(f"{model:<15}{'ratio':<11}{res['batched'][0] / res['unbatched'][0]:>9.2f}x")
    print("\none client (Triton's HTTP client), one request at a time: median latency against aim bench's median run")
    print(f"{'model':<15}{'aim bench':>10}{'binary':>9}{'JSON':>9}{'overhead bin':>14}{'overhead JSON':>15}")
    for model, _, single, bench in rows:
        print(f"{model:<15}{bench:>10.3f}{single[True]:>9.3f}{single[False]:>9.3f}"
              f"{single[True] - bench:>14.3f}{single[False] - bench:>15.3f}")


if __name__ == "__main__":
    sys.exit(main())
