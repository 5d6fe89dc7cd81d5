package gosdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/stretchr/testify/require"
)

type incrementRequest struct {
	By int `json:"by"`
}

type incrementResponse struct {
	Counter int    `json:"counter"`
	Invoker string `json:"invoker"`
}

// rpcBody: an AIO RPC command between two clients with the protocol
// package's defaults: the invoker subscribes to, and the executor answers
// on, clients/<invoker id>/<request topic>.
func rpcBody(ctx context.Context, t *testing.T, tg *target) {
	exec := newClient(t, tg, "rpcexec")
	inv := newClient(t, tg, "rpcinv")
	require.NotEqual(t, exec.ID(), inv.ID())

	const pattern = "rpc/gosdk/{executorId}/increment"
	requestTopic := "rpc/gosdk/" + exec.ID() + "/increment"
	responseTopic := "clients/" + inv.ID() + "/" + requestTopic

	var counter atomic.Int64
	var mu sync.Mutex
	var callers []string

	executor, err := protocol.NewCommandExecutor(app, exec,
		protocol.JSON[incrementRequest]{}, protocol.JSON[incrementResponse]{},
		pattern,
		func(_ context.Context, req *protocol.CommandRequest[incrementRequest]) (*protocol.CommandResponse[incrementResponse], error) {
			mu.Lock()
			callers = append(callers, req.ClientID)
			mu.Unlock()
			if req.Payload.By < 0 {
				return nil, errors.New("negative increments are refused")
			}
			n := counter.Add(int64(req.Payload.By))
			return protocol.Respond(incrementResponse{Counter: int(n), Invoker: req.ClientID})
		},
		protocol.WithTopicTokens{"executorId": exec.ID()},
	)
	require.NoError(t, err)
	t.Cleanup(executor.Close)

	invoker, err := protocol.NewCommandInvoker(app, inv,
		protocol.JSON[incrementRequest]{}, protocol.JSON[incrementResponse]{},
		pattern,
	)
	require.NoError(t, err)
	t.Cleanup(invoker.Close)

	startCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	require.NoError(t, executor.Start(startCtx), "executor subscribe; SUBACKs %q", exec.subAckList())
	require.NoError(t, invoker.Start(startCtx), "invoker subscribe to %s; SUBACKs %q", responseTopic, inv.subAckList())
	require.Contains(t, inv.subscriptions(), "clients/"+inv.ID()+"/rpc/gosdk/+/increment",
		"the invoker subscribes to its default response topic filter")

	tokens := protocol.WithTopicTokens{"executorId": exec.ID()}
	for i := 1; i <= 3; i++ {
		res, err := invoker.Invoke(ctx, incrementRequest{By: 1}, tokens, protocol.WithTimeout(10*time.Second))
		require.NoError(t, err, "invoke %d", i)
		require.Equal(t, i, res.Payload.Counter)
		require.Equal(t, inv.ID(), res.Payload.Invoker, "the executor saw the invoker's client id")
		require.Equal(t, exec.ID(), res.TopicTokens["executorId"])
		require.Len(t, res.CorrelationData, 36, "a UUID correlation id")
	}

	// Concurrent invocations are matched to their own responses.
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := invoker.Invoke(ctx, incrementRequest{By: 10}, tokens, protocol.WithTimeout(10*time.Second))
			switch {
			case err != nil:
				errs <- err
			case res.Payload.Counter < 13 || res.Payload.Counter > 53 || (res.Payload.Counter-3)%10 != 0:
				errs <- fmt.Errorf("unexpected counter %d", res.Payload.Counter)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(53), counter.Load())

	// An executor error reaches the invoker.
	_, err = invoker.Invoke(ctx, incrementRequest{By: -1}, tokens, protocol.WithTimeout(10*time.Second))
	require.Error(t, err)
	require.Contains(t, err.Error(), "negative increments are refused")

	// The responses came into the invoker's own clients/ space.
	assertReceivedTopic(t, inv, responseTopic)
	for _, topic := range inv.receivedTopics() {
		require.True(t, strings.HasPrefix(topic, "clients/"+inv.ID()+"/"), "invoker received %q", topic)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, callers, 9)
	for _, c := range callers {
		require.Equal(t, inv.ID(), c)
	}
}

// TestRPCCommandBetweenClients: see rpcBody.
func TestRPCCommandBetweenClients(t *testing.T) {
	ctx := testContext(t)
	rpcBody(ctx, t, plainServer(t))
}
