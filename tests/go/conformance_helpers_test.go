package gosdk

// Helpers of conformance_test.go: MQTT 5 clients on the low-level Eclipse Paho
// package (paho.NewClient on a net.Conn we dial, so that the tests control the
// CONNECT properties and subscription options and see every reason code), and
// a raw client that reads packets itself (for what paho hides: several
// Subscription Identifiers in one PUBLISH, unacknowledged QoS 1 deliveries, a
// client that stays silent).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

const (
	// confTimeout bounds the wait for one expected packet or message.
	confTimeout = 5 * time.Second
	// confQuiet is how long a test waits to be sure that nothing arrives.
	confQuiet = 400 * time.Millisecond
	// confDialTimeout bounds dialing and the CONNECT/CONNACK exchange.
	confDialTimeout = 10 * time.Second
)

func (tg *target) addr() string {
	return net.JoinHostPort(tg.host, strconv.Itoa(int(tg.port)))
}

// confServer is the broker the conformance tests use: the embedded broker
// (or, with STATESTORE_MODE=external, mosquitto, to check the tests of the
// generic MQTT behaviour themselves).
func confServer(t *testing.T) *target {
	t.Helper()
	// They check the embedded broker's MQTT 5 behaviour; mosquitto 2.0.11's
	// own differs in places (Receive Maximum, the DISCONNECT of a session
	// taken over, keep-alive timing). The store's privacy is checked on
	// every broker.
	if mosquittoBroker() && !strings.HasPrefix(t.Name(), "TestConformanceStorePrivacy") {
		t.Skip("mosquitto: the embedded broker's MQTT 5 conformance")
	}
	// TestMain writes the servers' logs of a failed run into workDir, which
	// only the TLS and external servers create: without it they would land
	// in the current directory.
	if _, err := getWorkDir(); err != nil {
		t.Fatalf("work dir: %v", err)
	}
	tg := plainServer(t)
	if tg.tls {
		t.Fatalf("the conformance tests need a plain listener")
	}
	return tg
}

// confTopic is a topic prefix of one test.
func confTopic(name string) string {
	return "conf/" + name + "-" + randomHex(4)
}

func u16(v uint16) *uint16 { return &v }
func u32(v uint32) *uint32 { return &v }

// ---------------------------------------------------------------------------
// Paho clients

type confOpts struct {
	id            string // default: a fresh clientID("conf")
	resume        bool   // Clean Start = 0
	sessionExpiry *uint32
	keepAlive     uint16 // default 30
	receiveMax    *uint16
	topicAliasMax *uint16
	manualAck     bool // the test acknowledges QoS 1/2 messages itself
}

// confClient is a connected paho client that queues every PUBLISH it
// receives (with the topic alias resolved) on msgs.
type confClient struct {
	t       *testing.T
	id      string
	cli     *paho.Client
	connack *paho.Connack
	msgs    chan *paho.Publish
	discs   chan *paho.Disconnect
	errs    chan error
	aliases map[uint16]string // server topic aliases (only the paho worker touches it)

	mu       sync.Mutex
	overflow int
}

func (c *confClient) onPublish(pr paho.PublishReceived) (bool, error) {
	p := *pr.Packet
	if p.Properties != nil && p.Properties.TopicAlias != nil {
		a := *p.Properties.TopicAlias
		if p.Topic != "" {
			c.aliases[a] = p.Topic
		} else {
			p.Topic = c.aliases[a] // "" when the broker used an alias it never set: the test sees it
		}
	}
	select {
	case c.msgs <- &p:
	default:
		c.mu.Lock()
		c.overflow++
		c.mu.Unlock()
	}
	return true, nil
}

// dialConf connects a paho client; a refused CONNECT returns the CONNACK and
// an error.
func dialConf(t *testing.T, tg *target, o confOpts) (*confClient, *paho.Connack, error) {
	t.Helper()
	if o.id == "" {
		o.id = clientID("conf")
	}
	if o.keepAlive == 0 {
		o.keepAlive = 30
	}
	conn, err := net.DialTimeout("tcp", tg.addr(), confDialTimeout)
	if err != nil {
		return nil, nil, err
	}
	c := &confClient{
		t:       t,
		id:      o.id,
		msgs:    make(chan *paho.Publish, 4096),
		discs:   make(chan *paho.Disconnect, 4),
		errs:    make(chan error, 16),
		aliases: map[uint16]string{},
	}
	c.cli = paho.NewClient(paho.ClientConfig{
		ClientID:          o.id,
		Conn:              packets.NewThreadSafeConn(conn),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){c.onPublish},
		OnServerDisconnect: func(d *paho.Disconnect) {
			select {
			case c.discs <- d:
			default:
			}
		},
		OnClientError: func(err error) {
			select {
			case c.errs <- err:
			default:
			}
		},
		EnableManualAcknowledgment: o.manualAck,
		SendAcksInterval:           10 * time.Millisecond,
		PacketTimeout:              confDialTimeout,
	})
	cp := &paho.Connect{
		ClientID:   o.id,
		KeepAlive:  o.keepAlive,
		CleanStart: !o.resume,
		Properties: &paho.ConnectProperties{
			SessionExpiryInterval: o.sessionExpiry,
			ReceiveMaximum:        o.receiveMax,
			TopicAliasMaximum:     o.topicAliasMax,
			RequestProblemInfo:    true,
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), confDialTimeout)
	defer cancel()
	ca, err := c.cli.Connect(ctx, cp)
	c.connack = ca
	if err != nil {
		_ = conn.Close()
		return nil, ca, err
	}
	t.Cleanup(c.disconnect)
	return c, ca, nil
}

// connectConf connects a paho client or fails the test.
func connectConf(t *testing.T, tg *target, o confOpts) *confClient {
	t.Helper()
	c, ca, err := dialConf(t, tg, o)
	if err != nil {
		tg.alive(t)
		t.Fatalf("CONNECT %s: %v (CONNACK %s)", o.id, err, connackString(ca))
	}
	return c
}

// disconnect sends DISCONNECT (normal, reason 0x00) and closes the
// connection; it may be called more than once.
func (c *confClient) disconnect() {
	_ = c.cli.Disconnect(&paho.Disconnect{ReasonCode: 0})
}

func connackString(ca *paho.Connack) string {
	if ca == nil {
		return "<none>"
	}
	s := fmt.Sprintf("reason 0x%02X, session present %t", ca.ReasonCode, ca.SessionPresent)
	if p := ca.Properties; p != nil {
		if p.ReasonString != "" {
			s += fmt.Sprintf(", reason string %q", p.ReasonString)
		}
		if p.ServerKeepAlive != nil {
			s += fmt.Sprintf(", server keep alive %d", *p.ServerKeepAlive)
		}
		if p.TopicAliasMaximum != nil {
			s += fmt.Sprintf(", topic alias maximum %d", *p.TopicAliasMaximum)
		}
		if p.ReceiveMaximum != nil {
			s += fmt.Sprintf(", receive maximum %d", *p.ReceiveMaximum)
		}
		if p.MaximumQoS != nil {
			s += fmt.Sprintf(", maximum QoS %d", *p.MaximumQoS)
		}
		if p.SessionExpiryInterval != nil {
			s += fmt.Sprintf(", session expiry %d", *p.SessionExpiryInterval)
		}
		s += fmt.Sprintf(", retain/wildcard/subid/shared available %t/%t/%t/%t",
			p.RetainAvailable, p.WildcardSubAvailable, p.SubIDAvailable, p.SharedSubAvailable)
	}
	return s
}

// maxQoS is the CONNACK's Maximum QoS (2 when absent).
func (c *confClient) maxQoS() byte {
	if c.connack != nil && c.connack.Properties != nil && c.connack.Properties.MaximumQoS != nil {
		return *c.connack.Properties.MaximumQoS
	}
	return 2
}

// subscribe sends one SUBSCRIBE (with a Subscription Identifier when subID >
// 0) and returns the SUBACK.
func (c *confClient) subscribe(subID int, subs ...paho.SubscribeOptions) (*paho.Suback, error) {
	s := &paho.Subscribe{Subscriptions: subs}
	if subID > 0 {
		s.Properties = &paho.SubscribeProperties{SubscriptionIdentifier: &subID}
	}
	ctx, cancel := context.WithTimeout(context.Background(), confTimeout)
	defer cancel()
	return c.cli.Subscribe(ctx, s)
}

// mustSubscribe subscribes and checks that the SUBACK grants each
// subscription's QoS.
func (c *confClient) mustSubscribe(subID int, subs ...paho.SubscribeOptions) {
	c.t.Helper()
	sa, err := c.subscribe(subID, subs...)
	if err != nil {
		c.t.Fatalf("%s: SUBSCRIBE %+v: %v (SUBACK %s)", c.id, subs, err, subackString(sa))
	}
	if len(sa.Reasons) != len(subs) {
		c.t.Fatalf("%s: SUBSCRIBE of %d filters: SUBACK has %d reason codes %v", c.id, len(subs), len(sa.Reasons), sa.Reasons)
	}
	for i, s := range subs {
		if sa.Reasons[i] != s.QoS {
			c.t.Fatalf("%s: SUBSCRIBE %q QoS %d: SUBACK reason 0x%02X, want the granted QoS %d", c.id, s.Topic, s.QoS, sa.Reasons[i], s.QoS)
		}
	}
}

// sub subscribes to one filter at qos.
func (c *confClient) sub(filter string, qos byte) {
	c.t.Helper()
	c.mustSubscribe(0, paho.SubscribeOptions{Topic: filter, QoS: qos})
}

func (c *confClient) unsubscribe(filters ...string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), confTimeout)
	defer cancel()
	if _, err := c.cli.Unsubscribe(ctx, &paho.Unsubscribe{Topics: filters}); err != nil {
		c.t.Fatalf("%s: UNSUBSCRIBE %q: %v", c.id, filters, err)
	}
}

func subackString(sa *paho.Suback) string {
	if sa == nil {
		return "<none>"
	}
	var codes []string
	for _, r := range sa.Reasons {
		codes = append(codes, fmt.Sprintf("0x%02X", r))
	}
	s := "[" + strings.Join(codes, " ") + "]"
	if sa.Properties != nil && sa.Properties.ReasonString != "" {
		s += fmt.Sprintf(" %q", sa.Properties.ReasonString)
	}
	return s
}

// publish sends p and returns the PUBACK/PUBCOMP (nil-safe for QoS 0).
func (c *confClient) publish(p *paho.Publish) (*paho.PublishResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), confTimeout)
	defer cancel()
	return c.cli.Publish(ctx, p)
}

// pub publishes and fails the test unless the broker accepts it.
func (c *confClient) pub(topic, payload string, qos byte, retain bool) {
	c.t.Helper()
	pr, err := c.publish(&paho.Publish{Topic: topic, Payload: []byte(payload), QoS: qos, Retain: retain})
	if err != nil {
		code := "-"
		if pr != nil {
			code = fmt.Sprintf("0x%02X", pr.ReasonCode)
		}
		c.t.Fatalf("%s: PUBLISH %q (QoS %d, retain %t): %v (reason %s)", c.id, topic, qos, retain, err, code)
	}
}

// barrier makes sure the broker has handled what this client sent before
// (a QoS 0 PUBLISH has no acknowledgement): a QoS 1 PUBLISH on a topic
// nobody subscribes to, acknowledged after the packets before it.
func (c *confClient) barrier() {
	c.t.Helper()
	c.pub("conf/barrier/"+randomHex(4), "", 1, false)
}

// next waits for the next message.
func (c *confClient) next(what string) *paho.Publish {
	c.t.Helper()
	return c.nextWithin(confTimeout, what)
}

func (c *confClient) nextWithin(d time.Duration, what string) *paho.Publish {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case m := <-c.msgs:
		return m
	case dp := <-c.discs:
		c.t.Fatalf("%s: %s: the broker disconnected the client (reason 0x%02X) instead", c.id, what, dp.ReasonCode)
	case <-timer.C:
		c.t.Fatalf("%s: %s: no message within %v", c.id, what, d)
	}
	return nil
}

// none fails the test if a message arrives within d.
func (c *confClient) none(d time.Duration, what string) {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case m := <-c.msgs:
		c.t.Fatalf("%s: %s: unexpected message %s", c.id, what, pubString(m))
	case <-timer.C:
	}
}

// drain returns the messages that arrive within d.
func (c *confClient) drain(d time.Duration) []*paho.Publish {
	var out []*paho.Publish
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m := <-c.msgs:
			out = append(out, m)
		case <-timer.C:
			return out
		}
	}
}

func pubString(m *paho.Publish) string {
	s := fmt.Sprintf("PUBLISH topic %q QoS %d retain %t payload %q", m.Topic, m.QoS, m.Retain, m.Payload)
	if m.Properties != nil {
		if m.Properties.TopicAlias != nil {
			s += fmt.Sprintf(" topic alias %d", *m.Properties.TopicAlias)
		}
		if m.Properties.SubscriptionIdentifier != nil {
			s += fmt.Sprintf(" subscription id %d", *m.Properties.SubscriptionIdentifier)
		}
		for _, u := range m.Properties.User {
			s += fmt.Sprintf(" %s=%q", u.Key, u.Value)
		}
	}
	return s
}

// expectMsg checks a received message's topic, payload, QoS and retain flag.
func expectMsg(t *testing.T, m *paho.Publish, topic, payload string, qos byte, retain bool, what string) {
	t.Helper()
	if m.Topic != topic || string(m.Payload) != payload || m.QoS != qos || m.Retain != retain {
		t.Fatalf("%s: got %s; want topic %q QoS %d retain %t payload %q", what, pubString(m), topic, qos, retain, payload)
	}
}

// ---------------------------------------------------------------------------
// Raw client

// rawPacket is one packet from the broker: PUBLISH is decoded here (all its
// Subscription Identifiers), the others by paho's packets package.
type rawPacket struct {
	typ   byte
	flags byte
	pub   *rawPublish
	cp    *packets.ControlPacket // not for PUBLISH
}

type rawPublish struct {
	topic   string
	id      uint16
	qos     byte
	retain  bool
	dup     bool
	payload []byte
	subIDs  []int
	alias   *uint16
}

func (p *rawPublish) String() string {
	return fmt.Sprintf("PUBLISH id %d topic %q QoS %d retain %t dup %t subscription ids %v payload %q",
		p.id, p.topic, p.qos, p.retain, p.dup, p.subIDs, p.payload)
}

func (p *rawPacket) String() string {
	if p.pub != nil {
		return p.pub.String()
	}
	if p.cp != nil {
		return p.cp.String()
	}
	return fmt.Sprintf("packet type %d", p.typ)
}

// rawClient reads packets on a goroutine; pkts is closed at EOF, after which
// err holds the read error.
type rawClient struct {
	t      *testing.T
	conn   net.Conn
	pkts   chan *rawPacket
	closed chan struct{}
	err    error
	wmu    sync.Mutex
}

func rawDial(t *testing.T, tg *target) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", tg.addr(), confDialTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", tg.addr(), err)
	}
	r := &rawClient{t: t, conn: conn, pkts: make(chan *rawPacket, 1024), closed: make(chan struct{})}
	go r.readLoop()
	t.Cleanup(func() { _ = conn.Close() })
	return r
}

func (r *rawClient) readLoop() {
	defer close(r.closed)
	defer close(r.pkts)
	br := bufio.NewReader(r.conn)
	for {
		p, err := readRawPacket(br)
		if err != nil {
			r.err = err
			return
		}
		r.pkts <- p
	}
}

func readRawPacket(br *bufio.Reader) (*rawPacket, error) {
	h, err := br.ReadByte()
	if err != nil {
		return nil, err
	}
	var length, mult int = 0, 1
	var hdr = []byte{h}
	for i := 0; ; i++ {
		b, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		hdr = append(hdr, b)
		length += int(b&0x7F) * mult
		if b&0x80 == 0 {
			break
		}
		if i == 3 {
			return nil, errors.New("malformed remaining length")
		}
		mult *= 128
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	p := &rawPacket{typ: h >> 4, flags: h & 0x0F}
	if p.typ == packets.PUBLISH {
		p.pub, err = parsePublish(p.flags, body)
		if err != nil {
			return nil, fmt.Errorf("decoding PUBLISH: %w", err)
		}
		return p, nil
	}
	p.cp, err = packets.ReadPacket(bytes.NewReader(append(hdr, body...)))
	if err != nil {
		return nil, fmt.Errorf("decoding packet type %d: %w", p.typ, err)
	}
	return p, nil
}

func parsePublish(flags byte, b []byte) (*rawPublish, error) {
	p := &rawPublish{dup: flags&8 != 0, qos: (flags >> 1) & 3, retain: flags&1 != 0}
	rd := bytes.NewReader(b)
	str := func() (string, error) {
		var n uint16
		if err := binary.Read(rd, binary.BigEndian, &n); err != nil {
			return "", err
		}
		s := make([]byte, n)
		_, err := io.ReadFull(rd, s)
		return string(s), err
	}
	vbi := func() (int, error) {
		v, mult := 0, 1
		for i := 0; i < 4; i++ {
			c, err := rd.ReadByte()
			if err != nil {
				return 0, err
			}
			v += int(c&0x7F) * mult
			if c&0x80 == 0 {
				return v, nil
			}
			mult *= 128
		}
		return 0, errors.New("malformed variable byte integer")
	}
	var err error
	if p.topic, err = str(); err != nil {
		return nil, err
	}
	if p.qos > 0 {
		if err := binary.Read(rd, binary.BigEndian, &p.id); err != nil {
			return nil, err
		}
	}
	plen, err := vbi()
	if err != nil {
		return nil, err
	}
	end := rd.Len() - plen
	for rd.Len() > end {
		id, err := rd.ReadByte()
		if err != nil {
			return nil, err
		}
		switch id {
		case 0x01: // payload format indicator
			_, err = rd.ReadByte()
		case 0x02: // message expiry interval
			var v uint32
			err = binary.Read(rd, binary.BigEndian, &v)
		case 0x03, 0x08, 0x09: // content type, response topic, correlation data
			_, err = str()
		case 0x0B:
			var v int
			v, err = vbi()
			p.subIDs = append(p.subIDs, v)
		case 0x23:
			var v uint16
			err = binary.Read(rd, binary.BigEndian, &v)
			p.alias = &v
		case 0x26:
			if _, err = str(); err == nil {
				_, err = str()
			}
		default:
			return nil, fmt.Errorf("property 0x%02X is not allowed in PUBLISH", id)
		}
		if err != nil {
			return nil, err
		}
	}
	p.payload = make([]byte, rd.Len())
	_, _ = io.ReadFull(rd, p.payload)
	return p, nil
}

type writerTo interface {
	WriteTo(io.Writer) (int64, error)
}

func (r *rawClient) send(p writerTo) {
	r.t.Helper()
	r.wmu.Lock()
	defer r.wmu.Unlock()
	_ = r.conn.SetWriteDeadline(time.Now().Add(confTimeout))
	if _, err := p.WriteTo(r.conn); err != nil {
		r.t.Fatalf("raw client: writing %T: %v", p, err)
	}
}

// read returns the next packet, or nil (and the reason) at a timeout or EOF.
func (r *rawClient) read(d time.Duration) (*rawPacket, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case p, ok := <-r.pkts:
		if !ok {
			if r.err == nil {
				return nil, io.EOF
			}
			return nil, r.err
		}
		return p, nil
	case <-timer.C:
		return nil, errTimeout
	}
}

var errTimeout = errors.New("timeout")

// expect reads the next packet and fails unless it has type typ.
func (r *rawClient) expect(typ byte, what string) *rawPacket {
	r.t.Helper()
	p, err := r.read(confTimeout)
	if err != nil {
		r.t.Fatalf("raw client: %s: waiting for packet type %d: %v", what, typ, err)
	}
	if p.typ != typ {
		r.t.Fatalf("raw client: %s: got %s, want packet type %d", what, p, typ)
	}
	return p
}

// connect sends CONNECT (MQTT 5) and returns the CONNACK.
func (r *rawClient) connect(cp *packets.Connect) *packets.Connack {
	r.t.Helper()
	cp.ProtocolName, cp.ProtocolVersion = "MQTT", 5
	if cp.Properties == nil {
		cp.Properties = &packets.Properties{}
	}
	r.send(cp)
	ca := r.expect(packets.CONNACK, "CONNECT").cp.Content.(*packets.Connack)
	if ca.ReasonCode != 0 {
		r.t.Fatalf("raw client %s: CONNACK reason 0x%02X", cp.ClientID, ca.ReasonCode)
	}
	return ca
}

// subscribe sends one SUBSCRIBE and returns the SUBACK's reason codes.
func (r *rawClient) subscribe(packetID uint16, subID int, subs ...packets.SubOptions) []byte {
	r.t.Helper()
	s := &packets.Subscribe{PacketID: packetID, Properties: &packets.Properties{}, Subscriptions: subs}
	if subID > 0 {
		s.Properties.SubscriptionIdentifier = &subID
	}
	r.send(s)
	sa := r.expect(packets.SUBACK, "SUBSCRIBE").cp.Content.(*packets.Suback)
	if sa.PacketID != packetID {
		r.t.Fatalf("raw client: SUBACK for packet id %d, want %d", sa.PacketID, packetID)
	}
	return sa.Reasons
}

// expectDisconnect reads to the DISCONNECT the server sends before closing
// the connection (skipping nothing else), and returns its reason code.
func (r *rawClient) expectDisconnect(what string) byte {
	r.t.Helper()
	p, err := r.read(confTimeout)
	if err != nil {
		r.t.Fatalf("%s: no DISCONNECT before the connection ended (%v)", what, err)
	}
	if p.typ != packets.DISCONNECT {
		r.t.Fatalf("%s: got %s, want DISCONNECT", what, p)
	}
	return p.cp.Content.(*packets.Disconnect).ReasonCode
}

func (r *rawClient) puback(id uint16) {
	r.t.Helper()
	r.send(&packets.Puback{PacketID: id, Properties: &packets.Properties{}})
}

// ---------------------------------------------------------------------------
// A dedicated embedded server (for tests that need other limits)

var (
	maxRetainedOnce   sync.Once
	maxRetainedTarget *target
	maxRetainedErr    error
)

// maxRetainedServer is an embedded server started with --max-retained 2.
func maxRetainedServer(t *testing.T) *target {
	t.Helper()
	if mosquittoBroker() {
		t.Skip("mosquitto: --max-retained belongs to the embedded broker")
	}
	if _, err := getWorkDir(); err != nil {
		t.Fatalf("work dir: %v", err)
	}
	maxRetainedOnce.Do(func() {
		bin, err := statestoreBin()
		if err != nil {
			maxRetainedErr = err
			return
		}
		port, err := freePort()
		if err != nil {
			maxRetainedErr = err
			return
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p, err := startProcess("statestore-maxretained", bin,
			serveArgs("serve", "--listen", addr, "--max-retained", "2")...)
		if err != nil {
			maxRetainedErr = err
			return
		}
		if err := waitPort(p, addr); err != nil {
			maxRetainedErr = err
			return
		}
		maxRetainedTarget = &target{name: "max-retained", host: "127.0.0.1", port: port, procs: []*server{p}}
	})
	if maxRetainedErr != nil {
		t.Fatalf("cannot start the --max-retained server: %v", maxRetainedErr)
	}
	maxRetainedTarget.alive(t)
	return maxRetainedTarget
}
