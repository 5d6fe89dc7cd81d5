package gosdk

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
	"github.com/stretchr/testify/require"
)

func newKey(name string) string { return "gosdk/" + name + "/" + randomHex(6) }

// --- bodies shared by the plain and the TLS tests ---------------------------

func crudBody(ctx context.Context, t *testing.T, tg *target) {
	_, s := storeClient(ctx, t, tg, "crud")
	key, val := newKey("crud"), "value-"+randomHex(4)

	set, err := s.Set(ctx, key, val)
	require.NoError(t, err)
	require.True(t, set.Value, "SET of a new key is applied")
	require.False(t, set.Version.IsZero(), "SET returns the new version")

	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, val, get.Value)
	require.Zero(t, set.Version.Compare(get.Version), "GET returns the version SET returned (%v vs %v)", get.Version, set.Version)

	val2 := "value2-" + randomHex(4)
	set2, err := s.Set(ctx, key, val2)
	require.NoError(t, err)
	require.True(t, set2.Value)
	require.Equal(t, 1, set2.Version.Compare(set.Version), "an overwrite gets a newer version")
	get, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, val2, get.Value)

	del, err := s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 1, del.Value, "DEL of a present key deletes 1")

	get, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.Empty(t, get.Value)
	require.True(t, get.Version.IsZero(), "a missing key has no version")

	del, err = s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 0, del.Value, "DEL of a missing key deletes 0")
}

func observeBody(ctx context.Context, t *testing.T, tg *target) {
	c, s := storeClient(ctx, t, tg, "observe")
	key := newKey("observe")

	ch, stop := s.Notify(key)
	defer stop()
	require.NoError(t, s.KeyNotify(ctx, key))

	val := "v-" + randomHex(4)
	set, err := s.Set(ctx, key, val)
	require.NoError(t, err)
	require.True(t, set.Value)
	n := nextNotify(ctx, t, ch, "SET notification")
	require.Equal(t, key, n.Key)
	require.Equal(t, "SET", n.Operation)
	require.Equal(t, val, n.Value)
	require.Zero(t, set.Version.Compare(n.Version), "the SET notification carries the new version (%v vs %v)", n.Version, set.Version)

	del, err := s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 1, del.Value)
	n = nextNotify(ctx, t, ch, "DELETE notification")
	require.Equal(t, key, n.Key)
	require.Equal(t, "DELETE", n.Operation)
	require.Empty(t, n.Value)
	require.False(t, n.Version.IsZero(), "the DELETE notification carries a version")
	require.Equal(t, 1, n.Version.Compare(set.Version), "the deletion is newer than the SET")

	// Delivered into the session: the Go SDK never subscribes to
	// notifications, yet they arrived on the notification topic.
	assertNoNotifySubscription(t, c)
	assertReceivedTopic(t, c, notifyTopic(c.ID(), key))

	require.NoError(t, s.KeyNotifyStop(ctx, key))
}

// --- plain listener tests ----------------------------------------------------

// TestStateStoreCRUD: SET/GET/DEL with versions.
func TestStateStoreCRUD(t *testing.T) {
	ctx := testContext(t)
	crudBody(ctx, t, plainServer(t))
}

// TestStateStoreEmptyValue: an empty value is a present key with a version.
func TestStateStoreEmptyValue(t *testing.T) {
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "empty")
	key := newKey("empty")

	set, err := s.Set(ctx, key, "")
	require.NoError(t, err)
	require.True(t, set.Value)
	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Empty(t, get.Value)
	require.False(t, get.Version.IsZero(), "an empty value still has a version")
	del, err := s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 1, del.Value)

	_, err = s.Set(ctx, "", "x")
	require.ErrorIs(t, err, statestore.ErrArgument, "the SDK refuses an empty key")
}

// TestStateStoreConditionalSet: NX (OnlyIfDoesNotExist) and NEX
// (OnlyIfEqualOrDoesNotExist).
func TestStateStoreConditionalSet(t *testing.T) {
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "condset")
	key := newKey("condset")
	v1, v2 := "one-"+randomHex(4), "two-"+randomHex(4)

	set, err := s.Set(ctx, key, v1, statestore.NotExists)
	require.NoError(t, err)
	require.True(t, set.Value, "NX on a missing key is applied")
	first := set.Version

	set, err = s.Set(ctx, key, v2, statestore.NotExists)
	require.NoError(t, err)
	require.False(t, set.Value, "NX on a present key is not applied")
	require.Zero(t, first.Compare(set.Version), "a skipped SET returns the stored version")

	set, err = s.Set(ctx, key, v2, statestore.NotExistsOrEqual)
	require.NoError(t, err)
	require.False(t, set.Value, "NEX with a different value is not applied")

	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v1, get.Value, "skipped SETs left the value alone")
	require.Zero(t, first.Compare(get.Version))

	set, err = s.Set(ctx, key, v1, statestore.NotExistsOrEqual)
	require.NoError(t, err)
	require.True(t, set.Value, "NEX with the equal value is applied")
	require.Equal(t, 1, set.Version.Compare(first), "an applied NEX bumps the version")

	del, err := s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 1, del.Value)

	set, err = s.Set(ctx, key, v2, statestore.NotExistsOrEqual)
	require.NoError(t, err)
	require.True(t, set.Value, "NEX on a missing key is applied")
	get, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v2, get.Value)

	_, err = s.Del(ctx, key)
	require.NoError(t, err)
}

// TestStateStoreVDel: delete only if the value matches.
func TestStateStoreVDel(t *testing.T) {
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "vdel")
	key, val := newKey("vdel"), "v-"+randomHex(4)

	_, err := s.Set(ctx, key, val)
	require.NoError(t, err)

	vdel, err := s.VDel(ctx, key, "other")
	require.NoError(t, err)
	require.Equal(t, -1, vdel.Value, "VDEL with another value: -1")
	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, val, get.Value, "a mismatched VDEL keeps the key")

	vdel, err = s.VDel(ctx, key, val)
	require.NoError(t, err)
	require.Equal(t, 1, vdel.Value, "VDEL with the value: 1")

	vdel, err = s.VDel(ctx, key, val)
	require.NoError(t, err)
	require.Equal(t, 0, vdel.Value, "VDEL of a missing key: 0")

	get, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, get.Version.IsZero())
}

// TestStateStoreFencingTokens: a key set with a fencing token (a lease's
// version) refuses writes without one or with an older one.
func TestStateStoreFencingTokens(t *testing.T) {
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "fencing")
	key := newKey("fenced")

	stale, err := app.GetHLC() // taken before the lease exists: lower
	require.NoError(t, err)

	lease := leasedlock.NewLease(s, newKey("fencing-lease"))
	ok, err := lease.Acquire(ctx, 20*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	ft, err := lease.Token(ctx)
	require.NoError(t, err)
	require.False(t, ft.IsZero())

	v1 := "fenced-" + randomHex(4)
	set, err := s.Set(ctx, key, v1, statestore.WithFencingToken(ft))
	require.NoError(t, err)
	require.True(t, set.Value)

	_, err = s.Set(ctx, key, "no-token")
	require.Equal(t, sserrors.MissingFencingToken, err, "SET without a token on a fenced key")
	_, err = s.Set(ctx, key, "stale", statestore.WithFencingToken(stale))
	require.Equal(t, sserrors.FencingTokenLowerVersion, err, "SET with an older token")
	_, err = s.Del(ctx, key)
	require.Equal(t, sserrors.MissingFencingToken, err, "DEL without a token")
	_, err = s.Del(ctx, key, statestore.WithFencingToken(stale))
	require.Equal(t, sserrors.FencingTokenLowerVersion, err, "DEL with an older token")
	_, err = s.VDel(ctx, key, v1, statestore.WithFencingToken(stale))
	require.Equal(t, sserrors.FencingTokenLowerVersion, err, "VDEL with an older token")

	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v1, get.Value, "refused writes left the value alone")

	// Re-acquiring the lease gives a newer token; a SET with it is applied
	// and stores it, so the first token is now the older one.
	ok, err = lease.Acquire(ctx, 20*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	ft2, err := lease.Token(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, ft2.Compare(ft))

	set, err = s.Set(ctx, key, "v2", statestore.WithFencingToken(ft2))
	require.NoError(t, err)
	require.True(t, set.Value)
	_, err = s.Set(ctx, key, "v3", statestore.WithFencingToken(ft))
	require.Equal(t, sserrors.FencingTokenLowerVersion, err, "the first token is older than the stored one")

	del, err := s.Del(ctx, key, statestore.WithFencingToken(ft2))
	require.NoError(t, err)
	require.Equal(t, 1, del.Value)

	// Deletion drops the stored token: the key is free again.
	set, err = s.Set(ctx, key, "free")
	require.NoError(t, err)
	require.True(t, set.Value)
	_, err = s.Del(ctx, key)
	require.NoError(t, err)

	require.NoError(t, lease.Release(ctx))
}

// TestStateStoreExpiry: a key set with PX disappears.
func TestStateStoreExpiry(t *testing.T) {
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "expiry")
	key := newKey("expiry")

	start := time.Now()
	set, err := s.Set(ctx, key, "short-lived", statestore.WithExpiry(time.Second))
	require.NoError(t, err)
	require.True(t, set.Value)

	get, err := s.Get(ctx, key)
	require.NoError(t, err)
	if time.Since(start) < 900*time.Millisecond {
		require.Equal(t, "short-lived", get.Value, "present before its expiry")
	}

	// A key without expiry next to it stays.
	keep := newKey("noexpiry")
	_, err = s.Set(ctx, keep, "stays")
	require.NoError(t, err)

	deadline := time.Now().Add(5 * time.Second)
	for {
		get, err = s.Get(ctx, key)
		require.NoError(t, err)
		if get.Version.IsZero() {
			break
		}
		require.True(t, time.Now().Before(deadline), "the key still exists %v after SET with a 1 s expiry", time.Since(start))
		time.Sleep(100 * time.Millisecond)
	}
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "expired too early")
	require.Empty(t, get.Value)

	get, err = s.Get(ctx, keep)
	require.NoError(t, err)
	require.Equal(t, "stays", get.Value)
	_, err = s.Del(ctx, keep)
	require.NoError(t, err)
}

// TestStateStoreObserve: KEYNOTIFY; SET and DELETE notifications arrive in
// the client's session although the Go SDK subscribes to nothing for them.
func TestStateStoreObserve(t *testing.T) {
	skipIfExternal(t, "observing a key")
	ctx := testContext(t)
	observeBody(ctx, t, plainServer(t))
}

// TestStateStoreObserveExpiry: a key that expires produces a DELETE
// notification.
func TestStateStoreObserveExpiry(t *testing.T) {
	skipIfExternal(t, "observing a key")
	ctx := testContext(t)
	c, s := storeClient(ctx, t, plainServer(t), "obsexpiry")
	key := newKey("obsexpiry")

	ch, stop := s.Notify(key)
	defer stop()
	require.NoError(t, s.KeyNotify(ctx, key))

	start := time.Now()
	set, err := s.Set(ctx, key, "expiring", statestore.WithExpiry(time.Second))
	require.NoError(t, err)
	require.True(t, set.Value)
	n := nextNotify(ctx, t, ch, "SET notification")
	require.Equal(t, "SET", n.Operation)
	require.Equal(t, "expiring", n.Value)

	n = nextNotify(ctx, t, ch, "DELETE notification on expiry")
	require.Equal(t, key, n.Key)
	require.Equal(t, "DELETE", n.Operation)
	require.Empty(t, n.Value)
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "expiry notified too early")
	require.Equal(t, 1, n.Version.Compare(set.Version))

	assertNoNotifySubscription(t, c)
	assertReceivedTopic(t, c, notifyTopic(c.ID(), key))
	require.NoError(t, s.KeyNotifyStop(ctx, key))
}

// TestStateStoreUnobserve: after KEYNOTIFY STOP no more notifications.
func TestStateStoreUnobserve(t *testing.T) {
	skipIfExternal(t, "observing a key")
	ctx := testContext(t)
	_, s := storeClient(ctx, t, plainServer(t), "unobserve")
	key := newKey("unobserve")

	ch, stop := s.Notify(key)
	defer stop()
	require.NoError(t, s.KeyNotify(ctx, key))

	_, err := s.Set(ctx, key, "a")
	require.NoError(t, err)
	require.Equal(t, "SET", nextNotify(ctx, t, ch, "first SET").Operation)
	_, err = s.Del(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "DELETE", nextNotify(ctx, t, ch, "first DELETE").Operation)

	require.NoError(t, s.KeyNotifyStop(ctx, key))

	_, err = s.Set(ctx, key, "b")
	require.NoError(t, err)
	_, err = s.Del(ctx, key)
	require.NoError(t, err)
	noNotify(t, ch, 1500*time.Millisecond, "after KEYNOTIFY STOP")
}

// TestStateStoreObserveOtherClient: one client observes, another writes;
// a repeated KEYNOTIFY does not double the notifications.
func TestStateStoreObserveOtherClient(t *testing.T) {
	skipIfExternal(t, "observing a key")
	ctx := testContext(t)
	tg := plainServer(t)
	obs, so := storeClient(ctx, t, tg, "observer")
	_, sw := storeClient(ctx, t, tg, "writer")
	key := newKey("other")

	ch, stop := so.Notify(key)
	defer stop()
	require.NoError(t, so.KeyNotify(ctx, key))
	require.NoError(t, so.KeyNotify(ctx, key)) // registered twice: still one per change

	val := "from-writer-" + randomHex(4)
	set, err := sw.Set(ctx, key, val)
	require.NoError(t, err)
	require.True(t, set.Value)
	n := nextNotify(ctx, t, ch, "SET by the other client")
	require.Equal(t, "SET", n.Operation)
	require.Equal(t, val, n.Value)
	noNotify(t, ch, 500*time.Millisecond, "a duplicate of the SET notification")

	vdel, err := sw.VDel(ctx, key, val)
	require.NoError(t, err)
	require.Equal(t, 1, vdel.Value)
	n = nextNotify(ctx, t, ch, "VDEL by the other client")
	require.Equal(t, "DELETE", n.Operation)

	// A skipped SET (NX on a present key) does not notify.
	_, err = sw.Set(ctx, key, "x")
	require.NoError(t, err)
	require.Equal(t, "SET", nextNotify(ctx, t, ch, "SET x").Operation)
	set, err = sw.Set(ctx, key, "y", statestore.NotExists)
	require.NoError(t, err)
	require.False(t, set.Value)
	noNotify(t, ch, 500*time.Millisecond, "a skipped NX SET")

	assertNoNotifySubscription(t, obs)
	assertReceivedTopic(t, obs, notifyTopic(obs.ID(), key))

	require.NoError(t, so.KeyNotifyStop(ctx, key)) // local count 2 -> 1
	require.NoError(t, so.KeyNotifyStop(ctx, key)) // sends STOP
	_, err = sw.Del(ctx, key)
	require.NoError(t, err)
	noNotify(t, ch, time.Second, "after STOP")
}
