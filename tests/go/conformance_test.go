package gosdk

// MQTT 5 conformance of the embedded broker, checked with the Eclipse Paho Go
// client (the low-level paho package) and a raw client. Items 1-8 are generic
// MQTT 5 behaviour: run them against mosquitto with STATESTORE_MODE=external
// to check the tests themselves. Items 9-11 are the product's own rules.
//
// Run: go test -run Conformance -v ./...

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// 1. Retained messages.
func TestConformanceRetained(t *testing.T) {
	tg := confServer(t)
	base := confTopic("retained")
	pub := connectConf(t, tg, confOpts{id: clientID("ret-pub")})
	maxQoS := pub.maxQoS()
	var toClear []string
	t.Cleanup(func() {
		for _, tp := range toClear {
			_, _ = pub.publish(&paho.Publish{Topic: tp, QoS: 1, Retain: true})
		}
	})

	t.Run("DeliveredToLaterSubscriber", func(t *testing.T) {
		topic := base + "/kept"
		toClear = append(toClear, topic)
		pub.pub(topic, "r1", 1, true)
		sub := connectConf(t, tg, confOpts{id: clientID("ret-sub")})
		sub.sub(topic, 1)
		m := sub.next("retained message at SUBSCRIBE")
		expectMsg(t, m, topic, "r1", 1, true, "retained message at SUBSCRIBE")
		sub.none(confQuiet, "only one retained message")
	})

	t.Run("EmptyPayloadClears", func(t *testing.T) {
		topic := base + "/cleared"
		toClear = append(toClear, topic)
		pub.pub(topic, "r2", 1, true)
		// Make sure it is retained first.
		s1 := connectConf(t, tg, confOpts{id: clientID("ret-sub1")})
		s1.sub(topic, 1)
		expectMsg(t, s1.next("retained message before clearing"), topic, "r2", 1, true, "before clearing")
		pub.pub(topic, "", 1, true)
		// The clearing PUBLISH is also forwarded to the existing subscriber
		// as a normal message (3.3.1.3): not asserted.
		s2 := connectConf(t, tg, confOpts{id: clientID("ret-sub2")})
		s2.sub(topic, 1)
		s2.none(confQuiet, "a retained message with an empty payload clears the topic (MQTT-3.3.1-6/7)")
	})

	t.Run("PublishedAfterSubackOnce", func(t *testing.T) {
		// A retained PUBLISH made after the SUBACK of a new subscription is
		// a live message for it: delivered once (retain 0, RAP=0), not once
		// live and again as "the retained message at subscribe time". At
		// QoS 0 a second copy breaks at-most-once.
		var dups []string
		for i := 0; i < 20; i++ {
			topic := fmt.Sprintf("%s/race-%d", base, i)
			toClear = append(toClear, topic)
			sub := connectConf(t, tg, confOpts{id: clientID("ret-race")})
			sub.sub(topic, 0)
			pub.pub(topic, "once", 0, true)
			first := sub.next(fmt.Sprintf("try %d: the publish", i))
			more := sub.drain(100 * time.Millisecond)
			if len(more) > 0 {
				d := []string{pubString(first)}
				for _, m := range more {
					d = append(d, pubString(m))
				}
				dups = append(dups, fmt.Sprintf("try %d: %s", i, strings.Join(d, " + ")))
			}
			sub.disconnect()
		}
		if len(dups) > 0 {
			t.Errorf("a QoS 0 retained PUBLISH made right after a new subscription's SUBACK was delivered more than once to it in %d of 20 tries:\n%s", len(dups), strings.Join(dups, "\n"))
		}
	})

	// The retained message is delivered at min(QoS of the PUBLISH, QoS of
	// the subscription) (MQTT-3.8.4-8: the granted QoS caps delivery).
	cases := []struct{ pubQoS, subQoS, want byte }{
		{1, 0, 0}, {0, 1, 0}, {1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 2}, {0, 2, 0}, {2, 0, 0},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("QoS/pub%d-sub%d", c.pubQoS, c.subQoS), func(t *testing.T) {
			if c.pubQoS > maxQoS || c.subQoS > maxQoS {
				t.Skipf("CONNACK Maximum QoS is %d", maxQoS)
			}
			topic := fmt.Sprintf("%s/qos-%d-%d", base, c.pubQoS, c.subQoS)
			toClear = append(toClear, topic)
			pub.pub(topic, "q", c.pubQoS, true)
			if c.pubQoS == 0 {
				pub.barrier()
			}
			sub := connectConf(t, tg, confOpts{id: clientID("ret-qos")})
			sub.sub(topic, c.subQoS)
			m := sub.next("retained message")
			expectMsg(t, m, topic, "q", c.want, true, "retained message QoS min(pub, sub)")
		})
	}
}

// 2. Subscription options.
func TestConformanceSubscribeOptions(t *testing.T) {
	tg := confServer(t)
	base := confTopic("subopts")

	t.Run("NoLocal", func(t *testing.T) {
		topic := base + "/nolocal"
		c := connectConf(t, tg, confOpts{id: clientID("nolocal")})
		w := connectConf(t, tg, confOpts{id: clientID("witness")})
		c.mustSubscribe(0, paho.SubscribeOptions{Topic: topic, QoS: 1, NoLocal: true})
		w.sub(topic, 1)
		c.pub(topic, "own", 1, false)
		expectMsg(t, w.next("witness"), topic, "own", 1, false, "witness")
		c.none(confQuiet, "No Local = 1: own publish must not come back (MQTT-3.8.3-3)")

		// Control: without No Local the own publish does come back.
		ctl := topic + "/control"
		c.mustSubscribe(0, paho.SubscribeOptions{Topic: ctl, QoS: 1})
		c.pub(ctl, "own2", 1, false)
		expectMsg(t, c.next("No Local = 0"), ctl, "own2", 1, false, "No Local = 0")
	})

	t.Run("RetainAsPublished", func(t *testing.T) {
		topic := base + "/rap"
		rap1 := connectConf(t, tg, confOpts{id: clientID("rap1")})
		rap0 := connectConf(t, tg, confOpts{id: clientID("rap0")})
		p := connectConf(t, tg, confOpts{id: clientID("rap-pub")})
		rap1.mustSubscribe(0, paho.SubscribeOptions{Topic: topic, QoS: 1, RetainAsPublished: true})
		rap0.mustSubscribe(0, paho.SubscribeOptions{Topic: topic, QoS: 1, RetainAsPublished: false})
		t.Cleanup(func() { _, _ = p.publish(&paho.Publish{Topic: topic, QoS: 1, Retain: true}) })
		// A live message first, so that the subscriptions are settled (see
		// Retained/PublishedAfterSubackOnce for the race this avoids).
		p.pub(topic, "settle", 1, false)
		expectMsg(t, rap1.next("RAP=1, settling"), topic, "settle", 1, false, "RAP=1, settling")
		expectMsg(t, rap0.next("RAP=0, settling"), topic, "settle", 1, false, "RAP=0, settling")
		p.pub(topic, "live-retained", 1, true)
		expectMsg(t, rap1.next("RAP=1"), topic, "live-retained", 1, true,
			"Retain As Published = 1 keeps the retain flag on a live delivery (MQTT-3.3.1-13)")
		expectMsg(t, rap0.next("RAP=0"), topic, "live-retained", 1, false,
			"Retain As Published = 0 clears the retain flag on a live delivery (MQTT-3.3.1-12)")
		// A non-retained publish is delivered with retain 0 to both.
		p.pub(topic, "live", 1, false)
		expectMsg(t, rap1.next("RAP=1, not retained"), topic, "live", 1, false, "RAP=1, not retained")
		expectMsg(t, rap0.next("RAP=0, not retained"), topic, "live", 1, false, "RAP=0, not retained")
	})

	t.Run("RetainHandling", func(t *testing.T) {
		topic := base + "/rh"
		p := connectConf(t, tg, confOpts{id: clientID("rh-pub")})
		t.Cleanup(func() { _, _ = p.publish(&paho.Publish{Topic: topic, QoS: 1, Retain: true}) })
		p.pub(topic, "kept", 1, true)

		var wg sync.WaitGroup
		errs := make(chan string, 16)
		check := func(rh byte, fn func(c *confClient) string) {
			c := connectConf(t, tg, confOpts{id: clientID(fmt.Sprintf("rh%d", rh))})
			wg.Add(1)
			go func() {
				defer wg.Done()
				if e := fn(c); e != "" {
					errs <- fmt.Sprintf("Retain Handling %d: %s", rh, e)
				}
			}()
		}
		sub := func(c *confClient, rh byte) string {
			sa, err := c.subscribe(0, paho.SubscribeOptions{Topic: topic, QoS: 1, RetainHandling: rh})
			if err != nil {
				return fmt.Sprintf("SUBSCRIBE: %v (SUBACK %s)", err, subackString(sa))
			}
			return ""
		}
		got := func(c *confClient, want bool, what string) string {
			select {
			case m := <-c.msgs:
				if !want {
					return fmt.Sprintf("%s: unexpected %s", what, pubString(m))
				}
				if m.Topic != topic || string(m.Payload) != "kept" || !m.Retain {
					return fmt.Sprintf("%s: got %s, want the retained message (retain 1)", what, pubString(m))
				}
				return ""
			case <-time.After(map[bool]time.Duration{true: confTimeout, false: confQuiet}[want]):
				if want {
					return what + ": the retained message was not sent"
				}
				return ""
			}
		}
		// 0: send retained messages at every subscribe, new or not (MQTT-3.3.1-9).
		check(0, func(c *confClient) string {
			if e := sub(c, 0); e != "" {
				return e
			}
			if e := got(c, true, "first SUBSCRIBE"); e != "" {
				return e
			}
			if e := sub(c, 0); e != "" {
				return e
			}
			return got(c, true, "repeated SUBSCRIBE (existing subscription)")
		})
		// 1: only if the subscription is new (MQTT-3.3.1-10).
		check(1, func(c *confClient) string {
			if e := sub(c, 1); e != "" {
				return e
			}
			if e := got(c, true, "first SUBSCRIBE (new subscription)"); e != "" {
				return e
			}
			if e := sub(c, 1); e != "" {
				return e
			}
			if e := got(c, false, "repeated SUBSCRIBE (existing subscription)"); e != "" {
				return e
			}
			ctx, cancel := context.WithTimeout(context.Background(), confTimeout)
			defer cancel()
			if _, err := c.cli.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{topic}}); err != nil {
				return fmt.Sprintf("UNSUBSCRIBE: %v", err)
			}
			if e := sub(c, 1); e != "" {
				return e
			}
			return got(c, true, "SUBSCRIBE after UNSUBSCRIBE (new subscription again)")
		})
		// 2: never (MQTT-3.3.1-11).
		check(2, func(c *confClient) string {
			if e := sub(c, 2); e != "" {
				return e
			}
			if e := got(c, false, "SUBSCRIBE"); e != "" {
				return e
			}
			if e := sub(c, 2); e != "" {
				return e
			}
			return got(c, false, "repeated SUBSCRIBE")
		})
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})
}

// 3. Shared subscriptions.
func TestConformanceSharedSubscription(t *testing.T) {
	tg := confServer(t)
	topic := confTopic("shared") + "/t"
	group := "g" + randomHex(3)
	shared := "$share/" + group + "/" + topic
	const n = 20

	m1 := connectConf(t, tg, confOpts{id: clientID("share1")})
	if p := m1.connack.Properties; p != nil && !p.SharedSubAvailable {
		t.Fatalf("CONNACK says Shared Subscription Available = 0")
	}
	m2 := connectConf(t, tg, confOpts{id: clientID("share2")})
	all := connectConf(t, tg, confOpts{id: clientID("nonshared")})
	pub := connectConf(t, tg, confOpts{id: clientID("share-pub")})
	m1.sub(shared, 1)
	m2.sub(shared, 1)
	all.sub(topic, 1)

	for i := 0; i < n; i++ {
		pub.pub(topic, strconv.Itoa(i), 1, false)
	}

	count := map[string]int{}
	per := map[string]int{}
	deadline := time.After(10 * time.Second)
	for total := 0; total < n; {
		select {
		case m := <-m1.msgs:
			count[string(m.Payload)]++
			per["member1"]++
			total++
		case m := <-m2.msgs:
			count[string(m.Payload)]++
			per["member2"]++
			total++
		case <-deadline:
			t.Fatalf("the group received %d of %d messages within 10 s (per member %v)", total, n, per)
		}
	}
	// Any duplicates would arrive now.
	for _, m := range append(m1.drain(confQuiet), m2.drain(50*time.Millisecond)...) {
		count[string(m.Payload)]++
	}
	for i := 0; i < n; i++ {
		if c := count[strconv.Itoa(i)]; c != 1 {
			t.Errorf("message %d delivered %d times across the group, want exactly once (MQTT 4.8.2)", i, c)
		}
	}
	if per["member1"] == 0 || per["member2"] == 0 {
		t.Errorf("one member received nothing of %d messages: %v (both subscribers are connected and acknowledging)", n, per)
	}
	t.Logf("shared group %q: distribution %v", group, per)

	got := map[string]int{}
	for len(got) < n {
		m := all.next(fmt.Sprintf("non-shared subscriber (has %d of %d)", len(got), n))
		got[string(m.Payload)]++
	}
	for _, m := range all.drain(confQuiet) {
		got[string(m.Payload)]++
	}
	for i := 0; i < n; i++ {
		if c := got[strconv.Itoa(i)]; c != 1 {
			t.Errorf("non-shared subscriber got message %d %d times, want once", i, c)
		}
	}
}

// 4. Overlapping subscriptions.
func TestConformanceOverlappingSubscriptions(t *testing.T) {
	tg := confServer(t)
	for _, order := range []string{"plus-first", "hash-first"} {
		t.Run(order, func(t *testing.T) {
			base := confTopic("overlap")
			plus := packets.SubOptions{Topic: base + "/a/+", QoS: 0}
			hash := packets.SubOptions{Topic: base + "/a/#", QoS: 1}
			const plusID, hashID = 1, 2

			r := rawDial(t, tg)
			r.connect(&packets.Connect{ClientID: clientID("overlap"), CleanStart: true, KeepAlive: 30})
			subs := []struct {
				o  packets.SubOptions
				id int
			}{{plus, plusID}, {hash, hashID}}
			if order == "hash-first" {
				subs[0], subs[1] = subs[1], subs[0]
			}
			for i, s := range subs {
				codes := r.subscribe(uint16(i+1), s.id, s.o)
				if len(codes) != 1 || codes[0] != s.o.QoS {
					t.Fatalf("SUBACK for %q QoS %d (subscription id %d): %v", s.o.Topic, s.o.QoS, s.id, codes)
				}
			}

			pub := connectConf(t, tg, confOpts{id: clientID("overlap-p")})
			topic := base + "/a/b"
			pub.pub(topic, "x", 1, false)

			var got []*rawPublish
			first := true
			for {
				d := confQuiet
				if first {
					d = confTimeout
				}
				p, err := r.read(d)
				if errors.Is(err, errTimeout) && !first {
					break
				}
				if err != nil {
					t.Fatalf("waiting for the PUBLISH: %v (got so far %v)", err, got)
				}
				if p.pub == nil {
					t.Fatalf("unexpected %s", p)
				}
				first = false
				got = append(got, p.pub)
				if p.pub.qos > 0 {
					r.puback(p.pub.id)
				}
			}
			for _, p := range got {
				t.Logf("received %s", p)
			}

			// MQTT-3.3.4-2: at least one copy at the max QoS of the matching
			// subscriptions (1).
			var maxQ byte
			for _, p := range got {
				if p.topic != topic || string(p.payload) != "x" {
					t.Errorf("unexpected %s", p)
				}
				maxQ = max(maxQ, p.qos)
			}
			if maxQ != 1 {
				t.Errorf("a PUBLISH sent at QoS 1 matching %q (QoS 0) and %q (QoS 1) arrived only at QoS %d; MQTT-3.3.4-2 requires delivery at the maximum QoS of the matching subscriptions, 1", plus.Topic, hash.Topic, maxQ)
			}
			switch len(got) {
			case 1:
				// MQTT-3.3.4-4: a single copy carries the identifiers of all
				// matching subscriptions.
				ids := slices.Sorted(slices.Values(got[0].subIDs))
				if !slices.Equal(ids, []int{plusID, hashID}) {
					t.Errorf("single copy has subscription identifiers %v, want both %v (MQTT-3.3.4-4)", got[0].subIDs, []int{plusID, hashID})
				}
			case 2:
				// MQTT-3.3.4-5: one copy per subscription, each with its own
				// identifier and QoS.
				for _, p := range got {
					switch {
					case slices.Equal(p.subIDs, []int{plusID}):
						if p.qos != 0 {
							t.Errorf("the copy for %q (QoS 0) came at QoS %d", plus.Topic, p.qos)
						}
					case slices.Equal(p.subIDs, []int{hashID}):
						if p.qos != 1 {
							t.Errorf("the copy for %q (QoS 1) came at QoS %d", hash.Topic, p.qos)
						}
					default:
						t.Errorf("copy %s: want exactly one subscription identifier per copy (MQTT-3.3.4-5)", p)
					}
				}
				if slices.Equal(got[0].subIDs, got[1].subIDs) {
					t.Errorf("both copies carry the same subscription identifier %v", got[0].subIDs)
				}
			default:
				t.Errorf("%d copies for 2 matching subscriptions", len(got))
			}
		})
	}
}

// 5. Session expiry and offline queueing.
func TestConformanceSessionExpiry(t *testing.T) {
	tg := confServer(t)

	t.Run("QueuedWhileOffline", func(t *testing.T) {
		topic := confTopic("session") + "/q"
		id := clientID("sess")
		dropSessionAtEnd(t, tg, id)
		c := connectConf(t, tg, confOpts{id: id, sessionExpiry: u32(30)})
		if c.connack.SessionPresent {
			t.Fatalf("CONNECT with Clean Start 1: session present = 1, want 0 (MQTT-3.2.2-2)")
		}
		c.sub(topic, 1)
		c.disconnect()

		pub := connectConf(t, tg, confOpts{id: clientID("sess-pub")})
		for i := 0; i < 3; i++ {
			pub.pub(topic, fmt.Sprintf("q%d", i), 1, false)
		}

		c2 := connectConf(t, tg, confOpts{id: id, resume: true, sessionExpiry: u32(30)})
		if !c2.connack.SessionPresent {
			t.Fatalf("reconnect with Clean Start 0 within the session expiry: session present = 0, want 1 (MQTT-3.2.2-3)")
		}
		for i := 0; i < 3; i++ {
			expectMsg(t, c2.next("message queued while offline"), topic, fmt.Sprintf("q%d", i), 1, false, "queued message, in order")
		}
		c2.none(confQuiet, "no more queued messages")
	})

	t.Run("ImmediateReconnectKeepsSession", func(t *testing.T) {
		// Disconnect, publish at once, reconnect at once (paho sends a
		// PINGREQ right after the CONNACK): the QoS 1 message, acknowledged
		// to its publisher, must reach the session.
		topic := confTopic("session") + "/imm"
		id := clientID("sess-imm")
		dropSessionAtEnd(t, tg, id)
		pub := connectConf(t, tg, confOpts{id: clientID("sess-ipub")})
		c := connectConf(t, tg, confOpts{id: id, sessionExpiry: u32(30)})
		c.sub(topic, 1)
		for i := 0; i < 10; i++ {
			c.disconnect()
			want := fmt.Sprintf("m%d", i)
			pub.pub(topic, want, 1, false)
			c = connectConf(t, tg, confOpts{id: id, resume: true, sessionExpiry: u32(30)})
			if !c.connack.SessionPresent {
				t.Fatalf("try %d: reconnect right after DISCONNECT with session expiry 30: session present = 0, want 1", i)
			}
			for {
				m := c.next(fmt.Sprintf("try %d: QoS 1 message %q, published (and PUBACKed to its publisher) right after the subscriber's DISCONNECT, never delivered to the resumed session", i, want))
				if m.Topic == topic && string(m.Payload) == want {
					break
				}
				// paho acknowledges asynchronously: an earlier message may
				// come again (QoS 1 redelivery of an unacknowledged message).
				if n, err := strconv.Atoi(strings.TrimPrefix(string(m.Payload), "m")); err != nil || n >= i || m.Topic != topic {
					t.Fatalf("try %d: unexpected %s", i, pubString(m))
				}
			}
		}
	})

	t.Run("RedeliveryInOrder", func(t *testing.T) {
		// Unacknowledged QoS 1 messages are sent again on reconnect, with
		// their original packet identifiers (MQTT-4.4.0-1), DUP set
		// (MQTT-3.3.1-1), in their original order (MQTT-4.6.0-1 and -6).
		topic := confTopic("session") + "/redeliver"
		id := clientID("sess-redel")
		dropSessionAtEnd(t, tg, id)
		const n = 5
		connect := func(clean bool) (*rawClient, *packets.Connack) {
			r := rawDial(t, tg)
			ca := r.connect(&packets.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
				Properties: &packets.Properties{SessionExpiryInterval: u32(30)}})
			return r, ca
		}
		r, _ := connect(true)
		r.subscribe(1, 0, packets.SubOptions{Topic: topic, QoS: 1})
		pub := connectConf(t, tg, confOpts{id: clientID("sess-rpub")})
		for i := 0; i < n; i++ {
			pub.pub(topic, fmt.Sprintf("m%d", i), 1, false)
		}
		var first []*rawPublish
		for len(first) < n {
			p := r.expect(packets.PUBLISH, fmt.Sprintf("message %d", len(first)))
			first = append(first, p.pub)
		}
		// Not acknowledged.
		r.send(&packets.Disconnect{Properties: &packets.Properties{}})
		_ = r.conn.Close()

		r, ca := connect(false)
		if !ca.SessionPresent {
			t.Fatalf("session present = 0 on reconnect")
		}
		var again []*rawPublish
		for len(again) < n {
			p := r.expect(packets.PUBLISH, fmt.Sprintf("redelivery %d", len(again)))
			again = append(again, p.pub)
			r.puback(p.pub.id)
		}
		var a, b []string
		for i := range n {
			a = append(a, fmt.Sprintf("%s/id %d", first[i].payload, first[i].id))
			b = append(b, fmt.Sprintf("%s/id %d/dup %t", again[i].payload, again[i].id, again[i].dup))
		}
		t.Logf("first delivery %v; redelivery %v", a, b)
		for i := range n {
			if string(again[i].payload) != string(first[i].payload) {
				t.Errorf("redelivered in the order %v, want the original order %v (MQTT-4.6.0-1, which MQTT-4.6.0-6 applies to the server)", b, a)
				break
			}
		}
		for _, p := range again {
			if !p.dup {
				t.Errorf("redelivery without DUP: %s (MQTT-3.3.1-1)", p)
			}
			for _, f := range first {
				if string(f.payload) == string(p.payload) && f.id != p.id {
					t.Errorf("%q redelivered with packet id %d, first sent with %d (MQTT-4.4.0-1: original packet identifiers)", p.payload, p.id, f.id)
				}
			}
		}
		if p, err := r.read(confQuiet); err == nil {
			t.Errorf("after the redeliveries: unexpected %s", p)
		}
	})

	t.Run("AckedNotRedelivered", func(t *testing.T) {
		// A message the client acknowledged (PUBACK written before its
		// DISCONNECT, on the same connection) is no longer part of the
		// session: it must not come again on reconnect (4.1, MQTT-4.4.0-1
		// resends only unacknowledged PUBLISHes).
		topic := confTopic("session") + "/acked"
		id := clientID("sess-acked")
		dropSessionAtEnd(t, tg, id)
		pub := connectConf(t, tg, confOpts{id: clientID("sess-apub")})
		var dups, acks []string
		var r *rawClient
		for i := 0; i < 10; i++ {
			r = rawDial(t, tg)
			ca := r.connect(&packets.Connect{ClientID: id, CleanStart: i == 0, KeepAlive: 30,
				Properties: &packets.Properties{SessionExpiryInterval: u32(30)}})
			if i == 0 {
				r.subscribe(1, 0, packets.SubOptions{Topic: topic, QoS: 1})
			} else if !ca.SessionPresent {
				t.Fatalf("try %d: session present = 0", i)
			}
			want := fmt.Sprintf("m%d", i)
			pub.pub(topic, want, 1, false)
			for {
				p := r.expect(packets.PUBLISH, fmt.Sprintf("try %d: %s", i, want))
				r.puback(p.pub.id)
				if string(p.pub.payload) == want {
					acks = append(acks, fmt.Sprintf("%s/id %d", want, p.pub.id))
					break
				}
				dups = append(dups, fmt.Sprintf("try %d: %s again (packet id %d, dup %t) though acknowledged", i, p.pub.payload, p.pub.id, p.pub.dup))
			}
			r.send(&packets.Disconnect{Properties: &packets.Properties{}})
			_ = r.conn.Close()
		}
		r = rawDial(t, tg)
		r.connect(&packets.Connect{ClientID: id, KeepAlive: 30, Properties: &packets.Properties{SessionExpiryInterval: u32(30)}})
		for {
			p, err := r.read(confQuiet)
			if err != nil {
				break
			}
			if p.pub != nil {
				r.puback(p.pub.id)
				dups = append(dups, fmt.Sprintf("final reconnect: %s again (packet id %d, dup %t) though acknowledged", p.pub.payload, p.pub.id, p.pub.dup))
			}
		}
		if len(dups) > 0 {
			t.Errorf("acknowledged QoS 1 messages delivered again after PUBACK + DISCONNECT + reconnect (first deliveries, each PUBACKed: %v):\n%s", acks, strings.Join(dups, "\n"))
		}
	})

	t.Run("ExpiryZero", func(t *testing.T) {
		topic := confTopic("session") + "/zero"
		id := clientID("sess-zero")
		for i := 0; i < 5; i++ {
			// Session Expiry absent = 0: the session ends when the network
			// connection closes (3.1.2.11.2), so a reconnect, however soon,
			// finds none.
			c := connectConf(t, tg, confOpts{id: id, resume: true})
			if c.connack.SessionPresent {
				t.Fatalf("try %d: CONNECT with Clean Start 0 right after a connection with session expiry 0 ended: session present = 1, want 0", i)
			}
			c.sub(topic, 1)
			c.disconnect()
		}
		// Also with an explicit Session Expiry Interval of 0.
		for i := 0; i < 5; i++ {
			c := connectConf(t, tg, confOpts{id: id, resume: true, sessionExpiry: u32(0)})
			if c.connack.SessionPresent {
				t.Fatalf("try %d (explicit expiry 0): session present = 1, want 0", i)
			}
			c.sub(topic, 1)
			c.disconnect()
		}
		// And the subscription is gone: nothing is delivered to the next
		// session.
		pub := connectConf(t, tg, confOpts{id: clientID("sess-zpub")})
		c := connectConf(t, tg, confOpts{id: id, resume: true})
		pub.pub(topic, "after", 1, false)
		c.none(confQuiet, "the previous sessions' subscription must be gone")
	})
}

// dropSessionAtEnd removes id's session when the test ends (Clean Start 1,
// no session expiry).
func dropSessionAtEnd(t *testing.T, tg *target, id string) {
	t.Helper()
	t.Cleanup(func() {
		if c, _, err := dialConf(t, tg, confOpts{id: id}); err == nil {
			c.disconnect()
		}
	})
}

// 6. Keep-alive.
func TestConformanceKeepAlive(t *testing.T) {
	t.Parallel()
	tg := confServer(t)

	t.Run("SilentClientDisconnected", func(t *testing.T) {
		t.Parallel()
		r := rawDial(t, tg)
		sent := time.Now()
		ca := r.connect(&packets.Connect{ClientID: clientID("ka-silent"), CleanStart: true, KeepAlive: 1})
		ka := 1.0
		if ca.Properties != nil && ca.Properties.ServerKeepAlive != nil {
			t.Logf("CONNACK Server Keep Alive %d (the client asked 1)", *ca.Properties.ServerKeepAlive)
			ka = float64(*ca.Properties.ServerKeepAlive)
			if ka == 0 || ka > 10 {
				t.Skipf("the server keep alive is %v s: not timed here", ka)
			}
		}
		var disc string
		for {
			p, err := r.read(time.Duration(ka*1.5*float64(time.Second)) + 3*time.Second)
			if err == nil {
				if p.typ == packets.DISCONNECT {
					disc = fmt.Sprintf("DISCONNECT reason 0x%02X", p.cp.Content.(*packets.Disconnect).ReasonCode)
					continue
				}
				t.Fatalf("unexpected %s from the broker to a silent client", p)
			}
			if errors.Is(err, errTimeout) {
				t.Fatalf("a client silent for %v with keep alive %v s is still connected (MQTT-3.1.2-22: disconnect after 1.5 x keep alive)", time.Since(sent).Round(time.Millisecond), ka)
			}
			break // EOF or reset: disconnected
		}
		el := time.Since(sent)
		t.Logf("silent client with keep alive %v s disconnected after %v (%s)", ka, el.Round(time.Millisecond), map[bool]string{true: disc, false: "connection closed without DISCONNECT"}[disc != ""])
		// MQTT-3.1.2-22: disconnect once 1.5 x keep alive passes without a
		// packet. Slack for timer granularity: mosquitto 2.0 (1 s ticks)
		// takes ~3.2 s for keep alive 1.
		lo, hi := time.Duration(ka*float64(time.Second)), time.Duration((ka*1.5+2)*float64(time.Second))
		if el < lo || el > hi {
			t.Errorf("a silent client with keep alive %v s was disconnected after %v, want between %v and %v (1.5 x keep alive = %v, MQTT-3.1.2-22, plus slack)",
				ka, el.Round(time.Millisecond), lo, hi, time.Duration(ka*1.5*float64(time.Second)))
		}
		if disc != "" && !strings.HasSuffix(disc, "0x8D") {
			t.Errorf("the broker sent %s; a keep alive timeout is 0x8D", disc)
		}
	})

	t.Run("PingingClientStays", func(t *testing.T) {
		t.Parallel()
		r := rawDial(t, tg)
		ca := r.connect(&packets.Connect{ClientID: clientID("ka-ping"), CleanStart: true, KeepAlive: 1})
		ka := 1 * time.Second
		if ca.Properties != nil && ca.Properties.ServerKeepAlive != nil {
			ka = time.Duration(*ca.Properties.ServerKeepAlive) * time.Second
			t.Logf("CONNACK Server Keep Alive %v: pinging at that period", ka)
		}
		// Ping at the keep alive period (what the client must honour,
		// MQTT-3.1.2-21 / 3.2.2.3.14), for 3 s.
		end := time.Now().Add(3 * time.Second)
		for time.Now().Before(end) {
			r.send(packets.NewControlPacket(packets.PINGREQ))
			p, err := r.read(confTimeout)
			if err != nil {
				t.Fatalf("a client pinging every %v was disconnected: %v", ka, err)
			}
			if p.typ != packets.PINGRESP {
				t.Fatalf("PINGREQ answered with %s", p)
			}
			time.Sleep(ka * 3 / 4)
		}
	})

	t.Run("PahoHonoursServerKeepAlive", func(t *testing.T) {
		t.Parallel()
		// paho pings at the CONNACK's Server Keep Alive when present, else at
		// its own; idle for 3 s with keep alive 1, it must stay connected.
		c := connectConf(t, tg, confOpts{id: clientID("ka-paho"), keepAlive: 1})
		t.Logf("CONNACK: %s", connackString(c.connack))
		select {
		case d := <-c.discs:
			t.Fatalf("disconnected by the broker: reason 0x%02X", d.ReasonCode)
		case err := <-c.errs:
			t.Fatalf("connection lost: %v", err)
		case <-time.After(3 * time.Second):
		}
		sub := confTopic("ka") + "/t"
		c.sub(sub, 1)
	})
}

// 7. Topic aliases.
func TestConformanceTopicAlias(t *testing.T) {
	tg := confServer(t)
	base := confTopic("alias")
	c := connectConf(t, tg, confOpts{id: clientID("alias-pub")})
	p := c.connack.Properties
	if p == nil || p.TopicAliasMaximum == nil || *p.TopicAliasMaximum == 0 {
		t.Fatalf("CONNACK Topic Alias Maximum absent or 0 (%s): the broker accepts no topic alias", connackString(c.connack))
	}
	t.Logf("CONNACK Topic Alias Maximum %d", *p.TopicAliasMaximum)

	// s accepts server aliases, s0 does not (Topic Alias Maximum absent = 0).
	s := connectConf(t, tg, confOpts{id: clientID("alias-sub"), topicAliasMax: u16(10)})
	s0 := connectConf(t, tg, confOpts{id: clientID("alias-sub0")})
	s.sub(base+"/#", 1)
	s0.sub(base+"/#", 1)

	t1, t2 := base+"/one", base+"/two"
	steps := []struct {
		topic string // sent topic ("" = alias only)
		want  string
	}{{t1, t1}, {"", t1}, {"", t1}, {t2, t2}, {"", t2}}
	for i, st := range steps {
		pr, err := c.publish(&paho.Publish{
			Topic: st.topic, QoS: 1, Payload: []byte(strconv.Itoa(i)),
			Properties: &paho.PublishProperties{TopicAlias: u16(1)},
		})
		if err != nil {
			code := "-"
			if pr != nil {
				code = fmt.Sprintf("0x%02X", pr.ReasonCode)
			}
			t.Fatalf("step %d: PUBLISH topic %q alias 1: %v (PUBACK %s)", i, st.topic, err, code)
		}
	}
	// More messages on the same topics, to give the broker reasons to use
	// its own aliases towards s.
	for i := 0; i < 3; i++ {
		c.pub(t1, "again"+strconv.Itoa(i), 1, false)
	}
	wants := []string{t1, t1, t1, t2, t2, t1, t1, t1}
	for _, sc := range []*confClient{s, s0} {
		var used int
		for i, w := range wants {
			m := sc.next(fmt.Sprintf("message %d", i))
			if m.Topic != w {
				t.Errorf("%s: message %d (%q) on topic %q, want %q", sc.id, i, m.Payload, m.Topic, w)
			}
			if m.Properties != nil && m.Properties.TopicAlias != nil {
				used++
				if sc == s0 {
					t.Errorf("%s: the broker sent topic alias %d to a client whose Topic Alias Maximum is 0 (MQTT-3.1.2-27)", sc.id, *m.Properties.TopicAlias)
				}
				if *m.Properties.TopicAlias > 10 {
					t.Errorf("%s: topic alias %d exceeds the client's Topic Alias Maximum 10 (MQTT-3.3.2-11)", sc.id, *m.Properties.TopicAlias)
				}
			}
		}
		t.Logf("%s: the broker used topic aliases in %d of %d messages", sc.id, used, len(wants))
		sc.none(confQuiet, "no more messages")
	}
}

// 8. Flow control (Receive Maximum).
func TestConformanceReceiveMaximum(t *testing.T) {
	tg := confServer(t)
	topic := confTopic("flow") + "/t"
	const n = 6

	r := rawDial(t, tg)
	r.connect(&packets.Connect{
		ClientID: clientID("flow"), CleanStart: true, KeepAlive: 30,
		Properties: &packets.Properties{ReceiveMaximum: u16(2)},
	})
	if codes := r.subscribe(1, 0, packets.SubOptions{Topic: topic, QoS: 1}); len(codes) != 1 || codes[0] != 1 {
		t.Fatalf("SUBACK %v", codes)
	}
	pub := connectConf(t, tg, confOpts{id: clientID("flow-pub")})
	for i := 0; i < n; i++ {
		pub.pub(topic, strconv.Itoa(i), 1, false)
	}

	var inflight []*rawPublish
	var received []string
	// readUntilQuiet reads PUBLISHes until none arrives for confQuiet
	// (waiting up to confTimeout for the first when want > 0), checking
	// the in-flight count.
	readUntilQuiet := func(want int, what string) {
		t.Helper()
		d := confTimeout
		if want == 0 {
			d = confQuiet
		}
		for {
			p, err := r.read(d)
			if errors.Is(err, errTimeout) {
				if want > 0 {
					t.Fatalf("%s: no PUBLISH within %v (received %q, in flight %d)", what, d, received, len(inflight))
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if p.pub == nil || p.pub.qos != 1 {
				t.Fatalf("%s: unexpected %s", what, p)
			}
			inflight = append(inflight, p.pub)
			received = append(received, string(p.pub.payload))
			if len(inflight) > 2 {
				t.Fatalf("%s: %d unacknowledged QoS 1 PUBLISHes in flight, the client's Receive Maximum is 2 (MQTT-3.3.4-9); received %q", what, len(inflight), received)
			}
			want--
			d = confQuiet
		}
	}
	readUntilQuiet(1, "before any PUBACK")
	if len(inflight) != 2 {
		t.Errorf("before any PUBACK: %d PUBLISHes in flight, expected the broker to fill the window of 2", len(inflight))
	}
	for len(received) < n {
		if len(inflight) == 0 {
			t.Fatalf("nothing in flight and only %q of %d received", received, n)
		}
		// Acknowledge the oldest: one more may come.
		r.puback(inflight[0].id)
		inflight = inflight[1:]
		readUntilQuiet(min(1, n-len(received)-len(inflight)), fmt.Sprintf("after PUBACK (received %d)", len(received)))
	}
	for _, p := range inflight {
		r.puback(p.id)
	}
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	if !slices.Equal(received, want) {
		t.Errorf("received %q, want %q in order (ordered topic, MQTT 4.6)", received, want)
	}
	if p, err := r.read(confQuiet); err == nil {
		t.Errorf("after acknowledging all: unexpected %s", p)
	}
}

// 9. Reason codes.
func TestConformanceReasonCodes(t *testing.T) {
	t.Run("InvalidTopicFilter", func(t *testing.T) {
		tg := confServer(t)
		for _, filter := range []string{"a/#/b", "a/b#", "a/+b"} {
			r := rawDial(t, tg)
			r.connect(&packets.Connect{ClientID: clientID("badfilter"), CleanStart: true, KeepAlive: 30})
			r.send(&packets.Subscribe{PacketID: 7, Properties: &packets.Properties{},
				Subscriptions: []packets.SubOptions{{Topic: filter, QoS: 1}}})
			p, err := r.read(confTimeout)
			switch {
			case errors.Is(err, errTimeout):
				t.Errorf("SUBSCRIBE %q: no answer within %v (want SUBACK 0x8F or a DISCONNECT)", filter, confTimeout)
			case err != nil:
				// Closing the connection is allowed for a malformed packet
				// (4.13.1), though MQTT 5 prefers a DISCONNECT first.
				t.Logf("SUBSCRIBE %q: the broker closed the connection without DISCONNECT (%v)", filter, err)
			case p.typ == packets.SUBACK:
				sa := p.cp.Content.(*packets.Suback)
				if len(sa.Reasons) != 1 || sa.Reasons[0] != packets.SubackTopicFilterinvalid {
					codes := make([]string, len(sa.Reasons))
					for i, r := range sa.Reasons {
						codes[i] = fmt.Sprintf("0x%02X", r)
					}
					t.Errorf("SUBSCRIBE %q (wildcard misplaced, MQTT-4.7.1-1/2): SUBACK %v, want SUBACK 0x8F Topic Filter invalid, or DISCONNECT 0x81 Malformed Packet (4.13)", filter, codes)
				} else {
					t.Logf("SUBSCRIBE %q: SUBACK 0x8F", filter)
				}
				// The connection must stay usable.
				r.send(packets.NewControlPacket(packets.PINGREQ))
				r.expect(packets.PINGRESP, "PINGREQ after SUBACK 0x8F")
			case p.typ == packets.DISCONNECT:
				rc := p.cp.Content.(*packets.Disconnect).ReasonCode
				// A malformed Topic Filter makes the packet malformed
				// (MQTT-4.7.1-1/2 and 4.13): DISCONNECT 0x81 or 0x82; 0x8F
				// is also a DISCONNECT reason code.
				if rc != 0x81 && rc != 0x82 && rc != 0x8F {
					t.Errorf("SUBSCRIBE %q: DISCONNECT 0x%02X, want 0x81, 0x82 or 0x8F (or SUBACK 0x8F)", filter, rc)
				} else {
					t.Logf("SUBSCRIBE %q: DISCONNECT 0x%02X", filter, rc)
				}
			default:
				t.Errorf("SUBSCRIBE %q: unexpected %s", filter, p)
			}
		}
	})

	t.Run("ClientIDWithSlash", func(t *testing.T) {
		tg := confServer(t)
		if mosquittoBroker() {
			t.Skip("mosquitto: the product's rule on client ids")
		}
		id := "go/slash-" + randomHex(4)
		c, ca, err := dialConf(t, tg, confOpts{id: id})
		if err == nil {
			c.disconnect()
			t.Fatalf("CONNECT with client id %q accepted (%s); the product refuses ids with '/'", id, connackString(ca))
		}
		if ca == nil {
			t.Fatalf("CONNECT with client id %q: no CONNACK (%v); want a refusing CONNACK", id, err)
		}
		if ca.ReasonCode < 0x80 {
			t.Fatalf("CONNECT with client id %q: %v with CONNACK %s", id, err, connackString(ca))
		}
		if ca.ReasonCode != 0x85 {
			t.Fatalf("CONNECT with client id %q refused with CONNACK %s, want 0x85 Client Identifier not valid", id, connackString(ca))
		}
	})

	// A server that ends a connection because of the client says why first
	// (MQTT 5, 4.13.2): a DISCONNECT with the reason, then the close.
	t.Run("ProtocolErrorDisconnect", func(t *testing.T) {
		tg := confServer(t)
		r := rawDial(t, tg)
		r.connect(&packets.Connect{ClientID: clientID("alias0"), CleanStart: true, KeepAlive: 30})
		r.send(&packets.Publish{Topic: confTopic("alias0"), QoS: 1, PacketID: 1,
			Properties: &packets.Properties{TopicAlias: u16(0)}, Payload: []byte("x")})
		rc := r.expectDisconnect("PUBLISH with Topic Alias 0 (MQTT-3.3.2-8)")
		if rc != 0x81 && rc != 0x82 && rc != 0x94 {
			t.Errorf("PUBLISH with Topic Alias 0: DISCONNECT 0x%02X, want 0x94 Topic Alias invalid, 0x81 or 0x82", rc)
		}
	})

	t.Run("SessionTakenOverDisconnect", func(t *testing.T) {
		tg := confServer(t)
		id := clientID("takeover")
		old := rawDial(t, tg)
		old.connect(&packets.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
		c := connectConf(t, tg, confOpts{id: id})
		defer c.disconnect()
		if rc := old.expectDisconnect("a new connection with the same client id (MQTT-3.1.4-3)"); rc != 0x8E {
			t.Errorf("taken over: DISCONNECT 0x%02X, want 0x8E Session taken over", rc)
		}
	})

	t.Run("ReceiveMaximumExceeded", func(t *testing.T) {
		tg := confServer(t)
		r := rawDial(t, tg)
		ca := r.connect(&packets.Connect{ClientID: clientID("recvmax"), CleanStart: true, KeepAlive: 30})
		max := uint16(65535)
		if ca.Properties != nil && ca.Properties.ReceiveMaximum != nil {
			max = *ca.Properties.ReceiveMaximum
		}
		if max > 1024 {
			t.Skipf("the broker's Receive Maximum is %d", max)
		}
		// QoS 2 PUBLISHes never released: each stays unacknowledged.
		topic := confTopic("recvmax")
		for i := 1; i <= int(max)+1; i++ {
			r.send(&packets.Publish{Topic: topic, QoS: 2, PacketID: uint16(i),
				Properties: &packets.Properties{}, Payload: []byte("x")})
		}
		for {
			p, err := r.read(confTimeout)
			if err != nil {
				t.Fatalf("%d QoS 2 PUBLISHes unreleased (Receive Maximum %d): no DISCONNECT before the connection ended (%v)", max+1, max, err)
			}
			if p.typ == packets.PUBREC {
				continue
			}
			if p.typ != packets.DISCONNECT {
				t.Fatalf("unexpected %s", p)
			}
			if rc := p.cp.Content.(*packets.Disconnect).ReasonCode; rc != 0x93 {
				t.Errorf("over the Receive Maximum: DISCONNECT 0x%02X, want 0x93 Receive Maximum exceeded (MQTT-3.3.4-8)", rc)
			}
			return
		}
	})

	t.Run("RetainedQuota", func(t *testing.T) {
		// A dedicated server with --max-retained 2.
		tg := maxRetainedServer(t)
		base := confTopic("quota")
		c := connectConf(t, tg, confOpts{id: clientID("quota")})
		pubCode := func(topic, payload string) (byte, error) {
			pr, err := c.publish(&paho.Publish{Topic: topic, Payload: []byte(payload), QoS: 1, Retain: true})
			if pr == nil {
				return 0xFF, err
			}
			return pr.ReasonCode, err
		}
		// Retained topics the broker itself holds (its $SYS tree).
		sys := connectConf(t, tg, confOpts{id: clientID("quota-sys")})
		sys.sub("$SYS/#", 0)
		var sysTopics []string
		for _, m := range sys.drain(confQuiet) {
			if m.Retain {
				sysTopics = append(sysTopics, m.Topic)
			}
		}

		// New retained topics until the quota refuses one.
		var codes []string
		accepted := 0
		for i := 0; i < 3; i++ {
			rc, err := pubCode(fmt.Sprintf("%s/%d", base, i), "v")
			codes = append(codes, fmt.Sprintf("0x%02X", rc))
			if rc == 0 {
				accepted++
				continue
			}
			if rc != 0x97 {
				t.Fatalf("retained PUBLISH on new topic %d: PUBACK 0x%02X (%v), want 0x00 or, past the quota, 0x97 Quota exceeded", i, rc, err)
			}
			break
		}
		t.Logf("--max-retained 2: PUBACKs %v for retained PUBLISHes on new topics; the broker holds %d retained $SYS topics %q", codes, len(sysTopics), sysTopics)
		if accepted > 2 {
			t.Fatalf("--max-retained 2: %d new retained topics accepted (PUBACKs %v)", accepted, codes)
		}
		if accepted == 3 || codes[len(codes)-1] != "0x97" {
			t.Fatalf("no PUBACK 0x97 past the quota: %v", codes)
		}
		if accepted < 2 {
			t.Errorf("--max-retained 2 (\"most topics holding a retained message\") let clients retain on %d topic(s), not 2 (PUBACKs %v): the broker's own %d retained $SYS topics %q count against the limit, so with --max-retained <= %d no client can retain anything",
				accepted, codes, len(sysTopics), sysTopics, len(sysTopics))
		}

		// The refused topic holds nothing; the accepted ones hold theirs.
		s := connectConf(t, tg, confOpts{id: clientID("quota-sub")})
		s.sub(base+"/#", 1)
		got := map[string]string{}
		for _, m := range s.drain(confQuiet) {
			got[m.Topic] = string(m.Payload)
		}
		want := map[string]string{}
		for i := 0; i < accepted; i++ {
			want[fmt.Sprintf("%s/%d", base, i)] = "v"
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("retained messages under %s: %v, want %v", base, got, want)
		}
		// A non-retained PUBLISH is not concerned.
		if pr, err := c.publish(&paho.Publish{Topic: base + "/x", Payload: []byte("x"), QoS: 1}); err != nil {
			t.Errorf("non-retained PUBLISH at the quota: %v (%v)", err, pr)
		}
		if accepted == 0 {
			t.Skip("no retained topic held: replacing and clearing not tested")
		}
		// Replacing a retained message does not take another slot.
		if rc, err := pubCode(base+"/0", "v2"); rc != 0 {
			t.Errorf("replacing the retained message of a held topic at the quota: PUBACK 0x%02X (%v), want 0x00", rc, err)
		}
		// Clearing one frees its slot.
		if rc, err := pubCode(base+"/0", ""); rc != 0 {
			t.Fatalf("clearing a retained message: PUBACK 0x%02X (%v)", rc, err)
		}
		if rc, err := pubCode(base+"/new", "v"); rc != 0 {
			t.Errorf("retained PUBLISH on a new topic after clearing one: PUBACK 0x%02X (%v), want 0x00", rc, err)
		}
		for i := 0; i < accepted; i++ {
			_, _ = pubCode(fmt.Sprintf("%s/%d", base, i), "")
		}
		_, _ = pubCode(base+"/new", "")
	})
}

// 10. $SYS topics.
func TestConformanceSys(t *testing.T) {
	t.Parallel()
	tg := confServer(t)
	if mosquittoBroker() {
		t.Skip("mosquitto: the embedded broker's $SYS tree")
	}
	// The wildcard subscriber is there from the start, through at least one
	// live publication of the tree.
	wild := connectConf(t, tg, confOpts{id: clientID("sys-wild")})
	wild.mustSubscribe(0,
		paho.SubscribeOptions{Topic: "#", QoS: 0},
		paho.SubscribeOptions{Topic: "+/broker/#", QoS: 0},
		paho.SubscribeOptions{Topic: "+/broker/version", QoS: 0},
	)

	c := connectConf(t, tg, confOpts{id: clientID("sys")})
	c.sub("$SYS/broker/version", 0)
	m := c.next("$SYS/broker/version (retained)")
	if !m.Retain || !strings.HasPrefix(string(m.Payload), "statestore") {
		t.Errorf("$SYS/broker/version: %s, want a retained message starting with \"statestore\"", pubString(m))
	}
	t.Logf("$SYS/broker/version = %q", m.Payload)

	want := map[string]*regexp.Regexp{
		"$SYS/broker/uptime":            regexp.MustCompile(`^\d+ seconds$`),
		"$SYS/broker/clients/connected": regexp.MustCompile(`^\d+$`),
		"$SYS/broker/messages/received": regexp.MustCompile(`^\d+$`),
		"$SYS/broker/messages/sent":     regexp.MustCompile(`^\d+$`),
	}
	c2 := connectConf(t, tg, confOpts{id: clientID("sys2")})
	c2.sub("$SYS/broker/#", 0)
	seen := map[string]string{}
	live := false
	deadline := time.After(15 * time.Second)
	for len(seen) < len(want)+1 || !live {
		select {
		case m := <-c2.msgs:
			seen[m.Topic] = string(m.Payload)
			if !m.Retain && m.Topic == "$SYS/broker/clients/connected" {
				live = true // published while we watch: counts this test's clients
			}
		case <-deadline:
			t.Fatalf("within 15 s: saw $SYS topics %v (live publication seen: %t); want %v and $SYS/broker/version", seen, live, slices.Collect(mapKeys(want)))
		}
	}
	for topic, re := range want {
		v, ok := seen[topic]
		if !ok {
			t.Errorf("%s: never published", topic)
		} else if !re.MatchString(v) {
			t.Errorf("%s = %q, want %v", topic, v, re)
		}
	}
	t.Logf("$SYS tree: %v", seen)
	if n, _ := strconv.Atoi(seen["$SYS/broker/clients/connected"]); n < 1 {
		t.Errorf("$SYS/broker/clients/connected = %q while this test holds 3 connections", seen["$SYS/broker/clients/connected"])
	}

	for _, m := range wild.drain(confQuiet) {
		if strings.HasPrefix(m.Topic, "$") {
			t.Errorf("a subscriber of \"#\" / \"+/broker/#\" received %s: topics starting with '$' must not match filters starting with a wildcard (MQTT-4.7.2-1)", pubString(m))
		}
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// 11. The store's replies reach only their requester.
func TestConformanceStorePrivacy(t *testing.T) {
	tg := confServer(t)
	if externalMode() {
		t.Skip("external mode: privacy of the store's traffic is the embedded broker's rule")
	}
	reqID := clientID("privreq")
	respTopic := "clients/" + reqID + "/services/" + stateStoreRequestTopic + "/response"

	spy := connectConf(t, tg, confOpts{id: clientID("spy")})
	var granted []string
	for _, f := range []string{"#", "clients/+/#", "clients/" + reqID + "/#", respTopic} {
		sa, err := spy.subscribe(0, paho.SubscribeOptions{Topic: f, QoS: 1})
		granted = append(granted, fmt.Sprintf("%s: %s (%v)", f, subackString(sa), err))
	}
	t.Logf("spy subscriptions: %q", granted)

	req := connectConf(t, tg, confOpts{id: reqID})
	req.sub(respTopic, 1)

	corr := make([]byte, 16)
	_, _ = rand.Read(corr)
	ts := fmt.Sprintf("%015d:%05d:%s", time.Now().UnixMilli(), 0, reqID)
	pr, err := req.publish(&paho.Publish{
		Topic: stateStoreRequestTopic, QoS: 1,
		Payload: []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"),
		Properties: &paho.PublishProperties{
			ResponseTopic:   respTopic,
			CorrelationData: corr,
			MessageExpiry:   u32(10), // the store requires one (as the SDKs send)
			User: paho.UserProperties{
				{Key: "__ts", Value: ts},
				{Key: "__protVer", Value: "1.0"},
			},
		},
	})
	if err != nil {
		t.Fatalf("request PUBLISH: %v (%v)", err, pr)
	}
	m := req.next("the store's reply")
	if m.Topic != respTopic || string(m.Payload) != "+OK\r\n" {
		t.Fatalf("reply: %s, want %q on %q", pubString(m), "+OK\r\n", respTopic)
	}
	if m.Properties == nil || string(m.Properties.CorrelationData) != string(corr) {
		t.Errorf("reply correlation data %x, want %x", m.Properties.CorrelationData, corr)
	}

	for _, sm := range spy.drain(confQuiet) {
		if strings.HasPrefix(sm.Topic, "clients/") {
			t.Errorf("the spy received %s: another client's store reply", pubString(sm))
		}
	}

	// Nobody else may publish onto the store's response topic.
	pr, err = spy.publish(&paho.Publish{Topic: respTopic, QoS: 1, Payload: []byte("+OK\r\n"),
		Properties: &paho.PublishProperties{CorrelationData: corr}})
	if pr == nil || pr.ReasonCode != 0x87 {
		code := "none"
		if pr != nil {
			code = fmt.Sprintf("0x%02X", pr.ReasonCode)
		}
		t.Errorf("a PUBLISH by %s onto %s's store response topic: PUBACK %s (%v), want 0x87 Not authorized", spy.id, reqID, code, err)
	}
	req.none(confQuiet, "a forged reply must not reach the requester")
}
