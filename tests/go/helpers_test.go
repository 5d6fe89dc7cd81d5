package gosdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/mqtt/retry"
	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
)

const (
	// testTimeout bounds every test (each test makes its context with it).
	testTimeout = 60 * time.Second
	// connectTimeout bounds a client's first connection.
	connectTimeout = 20 * time.Second
	// notifyTimeout bounds the wait for one notification.
	notifyTimeout = 10 * time.Second

	stateStoreRequestTopic = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"
	notifyTopicPrefix      = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/"
)

// One application (and so one HLC) per process, as an SDK user would have.
var app = protocol.Must(protocol.NewApplication())

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// clientID makes a distinct client id per test and role (at most 23
// characters, the limit the MQTT spec guarantees).
func clientID(role string) string {
	if len(role) > 10 {
		role = role[:10]
	}
	return "go-" + role + "-" + randomHex(4)
}

func hexUpper(s string) string {
	return strings.ToUpper(hex.EncodeToString([]byte(s)))
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// logBuffer collects one client's SDK logs; they are printed only if the test
// fails.
type logBuffer struct{ syncBuffer }

func newLogger(buf *logBuffer) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("GOSDK_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level}))
}

// testClient is an SDK session client that also records, for assertions,
// the filters it subscribed to and the topics of the messages it received.
type testClient struct {
	*mqtt.SessionClient
	t      *testing.T
	logs   *logBuffer
	logger *slog.Logger

	mu          sync.Mutex
	subscribed  []string
	subAcks     []string
	received    []string
	fatal       []error
	disconnects []string
	fatalCh     chan error
}

// Subscribe records the filter and the SUBACK, then subscribes.
func (c *testClient) Subscribe(
	ctx context.Context,
	topic string,
	opts ...mqtt.SubscribeOption,
) (*mqtt.Ack, error) {
	ack, err := c.SessionClient.Subscribe(ctx, topic, opts...)
	c.mu.Lock()
	c.subscribed = append(c.subscribed, topic)
	switch {
	case err != nil:
		c.subAcks = append(c.subAcks, fmt.Sprintf("%s: error %v", topic, err))
	case ack != nil:
		c.subAcks = append(c.subAcks, fmt.Sprintf("%s: reason 0x%02x %s", topic, ack.ReasonCode, ack.ReasonString))
	}
	c.mu.Unlock()
	return ack, err
}

func (c *testClient) subscriptions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.subscribed...)
}

func (c *testClient) receivedTopics() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.received...)
}

type clientOption func(*clientConfig)

type clientConfig struct {
	username, password *string
	noCA               bool
	attempts           uint64
	noWait             bool
}

func withCredentials(user, pass string) clientOption {
	return func(c *clientConfig) { c.username, c.password = &user, &pass }
}

// withoutCA makes a TLS client that does not trust the test CA.
func withoutCA() clientOption { return func(c *clientConfig) { c.noCA = true } }

// noWait returns the client without waiting for its first connection, and
// with a single connection attempt (for tests of refused connections).
func noWait() clientOption {
	return func(c *clientConfig) { c.noWait, c.attempts = true, 1 }
}

// newClient starts a session client connected to tg (TLS and credentials as
// tg says) and waits until it is connected.
func newClient(t *testing.T, tg *target, role string, opt ...clientOption) *testClient {
	t.Helper()
	cfg := clientConfig{attempts: 5}
	if tg.tls {
		cfg.username, cfg.password = &tg.username, &tg.password
	}
	for _, o := range opt {
		o(&cfg)
	}

	c := &testClient{t: t, logs: &logBuffer{}}
	c.logger = newLogger(c.logs)

	var conn mqtt.ConnectionProvider
	if tg.tls {
		var tlsOpts []mqtt.TLSOption
		if !cfg.noCA {
			tlsOpts = append(tlsOpts, mqtt.WithCA(tg.caFile))
		}
		conn = mqtt.TLSConnection(tg.host, tg.port, tlsOpts...)
	} else {
		conn = mqtt.TCPConnection(tg.host, tg.port)
	}

	opts := []mqtt.SessionClientOption{
		mqtt.WithLogger(c.logger),
		mqtt.WithCleanStart(true),
		mqtt.WithSessionExpiry(60),
		mqtt.WithConnectionTimeout(10 * time.Second),
		mqtt.WithConnectionRetry(&retry.ExponentialBackoff{
			MaxAttempts: cfg.attempts,
			MinInterval: 200 * time.Millisecond,
			MaxInterval: time.Second,
			Logger:      c.logger,
		}),
	}
	if cfg.username != nil {
		opts = append(opts, mqtt.WithUsername(mqtt.ConstantUsername(*cfg.username)))
	}
	if cfg.password != nil {
		opts = append(opts, mqtt.WithPassword(mqtt.ConstantPassword([]byte(*cfg.password))))
	}

	id := clientID(role)
	sc, err := mqtt.NewSessionClient(id, conn, opts...)
	if err != nil {
		t.Fatalf("NewSessionClient(%s): %v", id, err)
	}
	c.SessionClient = sc

	connected := make(chan struct{})
	var once sync.Once
	sc.RegisterConnectEventHandler(func(*mqtt.ConnectEvent) { once.Do(func() { close(connected) }) })
	fatal := make(chan error, 1)
	sc.RegisterFatalErrorHandler(func(err error) {
		c.mu.Lock()
		c.fatal = append(c.fatal, err)
		c.mu.Unlock()
		select {
		case fatal <- err:
		default:
		}
	})
	sc.RegisterDisconnectEventHandler(func(e *mqtt.DisconnectEvent) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case e.ReasonCode != nil:
			c.disconnects = append(c.disconnects, fmt.Sprintf("reason 0x%02x", *e.ReasonCode))
		case e.Error != nil:
			c.disconnects = append(c.disconnects, e.Error.Error())
		default:
			c.disconnects = append(c.disconnects, "disconnected")
		}
	})
	// Record every received topic (acked at once: the SDK acks a message
	// when every handler has).
	sc.RegisterMessageHandler(func(_ context.Context, m *mqtt.Message) {
		c.mu.Lock()
		c.received = append(c.received, m.Topic)
		c.mu.Unlock()
		m.Ack()
	})

	if err := sc.Start(); err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	t.Cleanup(func() {
		_ = sc.Stop()
		if t.Failed() {
			c.dump()
		}
	})
	c.fatalCh = fatal

	if cfg.noWait {
		return c
	}
	select {
	case <-connected:
	case err := <-fatal:
		t.Fatalf("client %s could not connect to %s:%d: %v", id, tg.host, tg.port, err)
	case <-time.After(connectTimeout):
		tg.alive(t)
		t.Fatalf("client %s not connected to %s:%d within %v", id, tg.host, tg.port, connectTimeout)
	}
	return c
}

func (c *testClient) dump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t.Logf("client %s: subscriptions %q; SUBACKs %q; fatal errors %v; disconnects %q; received topics %q\nSDK log:\n%s",
		c.ID(), c.subscribed, c.subAcks, c.fatal, c.disconnects, c.received, tail(c.logs.String(), 80))
}

// newStore makes and starts a state store client on c.
func newStore(ctx context.Context, t *testing.T, c *testClient) *statestore.Client[string, string] {
	t.Helper()
	s, err := statestore.New[string, string](app, c, statestore.WithLogger(c.logger))
	if err != nil {
		t.Fatalf("statestore.New: %v", err)
	}
	t.Cleanup(s.Close)
	startCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := s.Start(startCtx); err != nil {
		t.Fatalf("statestore client Start (subscribing to its response topic %q): %v; SUBACKs: %q",
			"clients/"+hexUpper(c.ID())+"/"+stateStoreRequestTopic+"/response", err, c.subAckList())
	}
	return s
}

func (c *testClient) subAckList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.subAcks...)
}

// storeClient is newClient + newStore.
func storeClient(ctx context.Context, t *testing.T, tg *target, role string) (*testClient, *statestore.Client[string, string]) {
	t.Helper()
	c := newClient(t, tg, role)
	return c, newStore(ctx, t, c)
}

// probeGet does one GET with a fresh client (external-mode readiness).
func probeGet(ctx context.Context, tg *target) error {
	sc, err := mqtt.NewSessionClient(clientID("probe"), mqtt.TCPConnection(tg.host, tg.port),
		mqtt.WithCleanStart(true), mqtt.WithSessionExpiry(10))
	if err != nil {
		return err
	}
	if err := sc.Start(); err != nil {
		return err
	}
	defer func() { _ = sc.Stop() }()
	s, err := statestore.New[string, string](app, sc)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		return err
	}
	_, err = s.Get(ctx, "probe-"+randomHex(4), statestore.WithTimeout(2*time.Second))
	return err
}

// nextNotify waits for one notification.
func nextNotify(ctx context.Context, t *testing.T, ch <-chan statestore.Notify[string, string], what string) statestore.Notify[string, string] {
	t.Helper()
	select {
	case n, ok := <-ch:
		if !ok {
			t.Fatalf("%s: notification channel closed", what)
		}
		return n
	case <-time.After(notifyTimeout):
		t.Fatalf("%s: no notification within %v", what, notifyTimeout)
	case <-ctx.Done():
		t.Fatalf("%s: %v", what, ctx.Err())
	}
	panic("unreachable")
}

// noNotify asserts that no notification arrives for d.
func noNotify(t *testing.T, ch <-chan statestore.Notify[string, string], d time.Duration, what string) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("%s: unexpected notification %s %q (version %v)", what, n.Operation, n.Value, n.Version)
	case <-time.After(d):
	}
}

// notifyTopic is where the store sends notifications for key to client id.
func notifyTopic(id, key string) string {
	return notifyTopicPrefix + hexUpper(id) + "/command/notify/" + hexUpper(key)
}

// assertNoNotifySubscription checks the Go SDK never subscribed to its
// notification topic: what it received came into its session unasked.
func assertNoNotifySubscription(t *testing.T, c *testClient) {
	t.Helper()
	for _, s := range c.subscriptions() {
		if strings.Contains(s, "/command/notify") {
			t.Fatalf("the Go SDK subscribed to %q; expected no notification subscription", s)
		}
	}
}

func assertReceivedTopic(t *testing.T, c *testClient, topic string) {
	t.Helper()
	// The recording handler runs concurrently with the SDK's; allow it a
	// moment.
	deadline := time.Now().Add(2 * time.Second)
	for {
		for _, r := range c.receivedTopics() {
			if r == topic {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %s never received a message on %q; received: %q", c.ID(), topic, c.receivedTopics())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
