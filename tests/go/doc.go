// Package gosdk holds the Azure IoT Operations Go SDK interoperability tests
// for `statestore serve`: the published, unmodified
// github.com/Azure/iot-operations-sdks/go/{mqtt,protocol,services} modules
// run against a server these tests start themselves. See README.md.
package gosdk
