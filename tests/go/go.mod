module statestore.test/gosdk

go 1.25.0

require (
	github.com/Azure/iot-operations-sdks/go/mqtt v0.4.2
	github.com/Azure/iot-operations-sdks/go/protocol v0.4.3
	github.com/Azure/iot-operations-sdks/go/services v0.4.1
	github.com/eclipse/paho.golang v0.23.0
	github.com/stretchr/testify v1.11.1
)

require (
	github.com/Azure/iot-operations-sdks/go/internal v0.3.1 // indirect
	github.com/VividCortex/ewma v1.2.0 // indirect
	github.com/cheggaaa/pb/v3 v3.1.7 // indirect
	github.com/clipperhouse/uax29/v2 v2.7.0 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/fatih/color v1.19.0 // indirect
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/iancoleman/strcase v0.3.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/mattn/go-runewidth v0.0.21 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/princjef/mageutil v1.0.0 // indirect
	github.com/relvacode/iso8601 v1.7.0 // indirect
	github.com/sosodev/duration v1.4.0 // indirect
	golang.org/x/crypto v0.45.0 // indirect
	golang.org/x/sys v0.42.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
