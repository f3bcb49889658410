// nats_pub: the NATS JetStream side of tests/bench/bench_vs_nats.py.
//
// It connects to the servers, (re)creates a file-backed stream of -replicas replicas on
// "<stream>.x" (lower case), publishes -warmup messages, prints {"ready": ...} and waits for a line on stdin.
// Then it publishes -n messages of -size bytes with PublishAsync (at most -max-pending
// unacknowledged, in loops of 1,000), waits for every acknowledgement (PublishAsyncComplete)
// and prints one JSON line: messages, acknowledgement errors, seconds, its own CPU seconds over
// that window, and the messages the stream took in it; then it deletes the stream.
//
// With -rate R > 0 (bench_latency_vs_nats.py) the timed part is an open loop instead: message i is
// published at t0 + i/R (the loop sleeps until then, never waits for an acknowledgement), and a
// goroutine per message takes the time from that scheduled instant to its acknowledgement; the JSON
// line then also carries "latencies_ms" (sorted) and the publisher's lateness.
//
// Built by bench_vs_nats.py with Debian's golang-go and golang-github-nats-io-go-nats-dev:
// GOPATH=/usr/share/gocode GO111MODULE=off CGO_ENABLED=0 go build
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "nats_pub: "+format+"\n", args...)
	os.Exit(1)
}

// values: a pool of 1,024 payloads of size bytes, random alphanumeric (or all "x").
func values(size int, kind string) [][]byte {
	rng := rand.New(rand.NewSource(14))
	pool := make([][]byte, 1024)
	for i := range pool {
		v := make([]byte, size)
		for j := range v {
			if kind == "x" {
				v[j] = 'x'
			} else {
				v[j] = alphabet[rng.Intn(len(alphabet))]
			}
		}
		pool[i] = v
	}
	return pool
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fail("getrusage: %v", err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// publish sends n messages in loops of 1,000; a publish refused because too many are
// outstanding (the client stalled longer than it waits) is retried.
func publish(js nats.JetStreamContext, subject string, n int, pool [][]byte) int64 {
	var stalls int64
	for i := 0; i < n; {
		end := i + 1000
		if end > n {
			end = n
		}
		for ; i < end; i++ {
			for {
				_, err := js.PublishAsync(subject, pool[i&1023])
				if err == nil {
					break
				}
				if !strings.Contains(err.Error(), "stalled") {
					fail("publish: %v", err)
				}
				stalls++
			}
		}
	}
	return stalls
}

// publishAt publishes n messages open loop at rate per second and returns each one's latency
// (ms, from its scheduled time to its acknowledgement, sorted), the stall retries and how late the
// loop ran at worst (ms).
func publishAt(js nats.JetStreamContext, subject string, n int, rate float64, pool [][]byte) ([]float64, int64, float64) {
	latencies := make([]float64, n)
	var stalls int64
	var wg sync.WaitGroup
	late := 0.0
	t0 := time.Now().Add(100 * time.Millisecond)
	for i := 0; i < n; i++ {
		scheduled := t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if wait := time.Until(scheduled); wait > 0 {
			time.Sleep(wait)
		} else if ms := float64(-wait) / 1e6; ms > late {
			late = ms
		}
		var future nats.PubAckFuture
		for {
			f, err := js.PublishAsync(subject, pool[i&1023])
			if err == nil {
				future = f
				break
			}
			if !strings.Contains(err.Error(), "stalled") {
				fail("publish: %v", err)
			}
			stalls++
		}
		wg.Add(1)
		go func(i int, scheduled time.Time, future nats.PubAckFuture) {
			defer wg.Done()
			select {
			case <-future.Ok():
			case <-future.Err():
			}
			latencies[i] = float64(time.Since(scheduled)) / 1e6
		}(i, scheduled, future)
	}
	wg.Wait()
	sort.Float64s(latencies)
	return latencies, stalls, late
}

func waitComplete(js nats.JetStreamContext, timeout time.Duration) {
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(timeout):
		fail("%d publishes still unacknowledged after %v", js.PublishAsyncPending(), timeout)
	}
}

func main() {
	urls := flag.String("urls", "", "comma-separated server URLs")
	stream := flag.String("stream", "BENCH", "stream name")
	replicas := flag.Int("replicas", 3, "stream replicas")
	n := flag.Int("n", 100000, "messages to time")
	warmup := flag.Int("warmup", 1000, "messages before the timed run")
	size := flag.Int("size", 100, "payload bytes")
	kind := flag.String("values", "random", "random or x")
	maxPending := flag.Int("max-pending", 4096, "PublishAsyncMaxPending")
	rate := flag.Float64("rate", 0, "open loop at this many messages a second (0: as fast as acknowledged)")
	flag.Parse()

	nc, err := nats.Connect(*urls, nats.Timeout(10*time.Second))
	if err != nil {
		fail("connect %s: %v", *urls, err)
	}
	defer nc.Close()
	var ackErrors int64
	var firstError atomic.Value
	js, err := nc.JetStream(
		nats.PublishAsyncMaxPending(*maxPending),
		nats.PublishAsyncErrHandler(func(_ nats.JetStream, _ *nats.Msg, err error) {
			if atomic.AddInt64(&ackErrors, 1) == 1 {
				firstError.Store(err.Error())
			}
		}),
	)
	if err != nil {
		fail("jetstream: %v", err)
	}
	// The cluster may still be electing its meta leader: retry for up to 60 s.
	subject := strings.ToLower(*stream) + ".x"
	cfg := &nats.StreamConfig{
		Name: *stream, Subjects: []string{subject}, Storage: nats.FileStorage, Replicas: *replicas,
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err = js.DeleteStream(*stream)
		if err == nil || errors.Is(err, nats.ErrStreamNotFound) {
			_, err = js.AddStream(cfg)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fail("create stream: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Right after its creation a replicated stream may not take writes yet: warm up until a whole
	// warm-up is acknowledged (for up to 60 s more).
	pool := values(*size, *kind)
	for {
		atomic.StoreInt64(&ackErrors, 0)
		publish(js, subject, *warmup, pool)
		waitComplete(js, 60*time.Second)
		if atomic.LoadInt64(&ackErrors) == 0 {
			break
		}
		if time.Now().After(deadline.Add(60 * time.Second)) {
			fail("%d warm-up publishes failed, the first with: %v", ackErrors, firstError.Load())
		}
		time.Sleep(500 * time.Millisecond)
	}
	warmed := uint64(0)
	if info, err := js.StreamInfo(*stream); err == nil {
		warmed = info.State.Msgs
	} else {
		fail("stream info: %v", err)
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]interface{}{"ready": true, "server": nc.ConnectedServerVersion()})
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail("no go line: %v", err)
	}

	cpu0, t0 := cpuSeconds(), time.Now()
	var latencies []float64
	var stalls int64
	lateMs := 0.0
	if *rate > 0 {
		latencies, stalls, lateMs = publishAt(js, subject, *n, *rate, pool)
	} else {
		stalls = publish(js, subject, *n, pool)
	}
	waitComplete(js, 300*time.Second)
	seconds, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0

	stored := uint64(0)
	if info, err := js.StreamInfo(*stream); err == nil {
		stored = info.State.Msgs - warmed
	} else {
		fail("stream info: %v", err)
	}
	_ = js.DeleteStream(*stream) // its disk space; the next run makes its own
	_ = out.Encode(map[string]interface{}{
		"messages":         *n,
		"ack_errors":       atomic.LoadInt64(&ackErrors),
		"stalled_retries":  stalls,
		"seconds":          seconds,
		"client_cpu_s":     cpu,
		"stream_msgs":      stored,
		"latencies_ms":     latencies,
		"max_send_late_ms": lateMs,
	})
}
