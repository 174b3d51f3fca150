// A vCenter simulator for the vSphere backend's tests (hypervisors/testing/vcsim.py builds and
// starts it): govmomi's simulator.VPX() inventory (datacenter DC0; standalone host DC0_H0 and
// cluster DC0_C0 of hosts DC0_C0_H0..2; VMs DC0_H0_VM0..2 and DC0_C0_RP0_VM0..2), whose hosts
// are made NVIDIA vGPU hosts:
//
//   - every host has two Tesla T4 GPUs (graphicsInfo, shared direct: 0000:3b:00.0 and
//     0000:5e:00.0) and offers the T4's Q types (config.sharedPassthruGpuTypes);
//   - DC0_H0_VM0 holds a grid_t4-4q vGPU on the first GPU, DC0_H0_VM1 and DC0_H0_VM2 a
//     grid_t4-8q each on the second (which is then full), DC0_C0_RP0_VM0 a grid_t4-2q on the
//     first GPU of its host (a VirtualPCIPassthrough device with VmiopBackingInfo, as vSphere
//     writes it); running VMs are listed on their GPU;
//   - DC0_H0_VM2 has a stubborn guest: ShutdownGuest is answered but the VM keeps running;
//   - the standalone host's VMs have known guest figures (see `guests`): their vCPUs and memory,
//     whether VMware Tools run, their quick stats (overallCpuUsage, guestMemoryUsage) and what the
//     performance manager's real-time counters cpu.usagemhz.average (per vCPU and all together)
//     and cpu.ready.summation say of the last 20 s sample (the simulator's own performance
//     manager answers generated, noisy series, the same for every VM);
//   - the privileges named by -deny are refused to the user (HasPrivilegeOnEntity says so);
//   - the task methods named by -hang (ReconfigVM_Task, PowerOnVM_Task, RelocateVM_Task, ...)
//     never finish: such a call is answered with a new Task whose info.state is "running" for
//     good, and the object it was called on is not changed. The simulator itself runs every task
//     to completion before it answers, so the request is answered here without being passed on.
//
// It listens on -listen (127.0.0.1:0 picks a free port), with TLS unless -tls=false, accepts
// only -username/-password, writes its certificate to -cafile when given, and prints
// "VCSIM_URL=<url>" on stdout once it serves. It stops on SIGTERM, SIGINT or the end of stdin.
package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

var gpuTypes = []string{"grid_t4-1q", "grid_t4-2q", "grid_t4-4q", "grid_t4-8q", "grid_t4-16q"}

var gpuBusIDs = []string{"0000:3b:00.0", "0000:5e:00.0"}

// The vGPU each VM is given: its type and the index of the GPU of its host it runs on.
var vgpus = map[string]struct {
	vgpu string
	gpu  int
}{
	"DC0_H0_VM0":     {"grid_t4-4q", 0},
	"DC0_H0_VM1":     {"grid_t4-8q", 1},
	"DC0_H0_VM2":     {"grid_t4-8q", 1},
	"DC0_C0_RP0_VM0": {"grid_t4-2q", 0},
}

const stubbornVM = "DC0_H0_VM2"

// What a VM's guest looks like through the hypervisor: its size, whether VMware Tools run, its
// quick stats, and its real-time performance counters' last sample.
type guestFigures struct {
	numCPU   int32
	memoryMB int32
	tools    bool
	usageMhz int32   // summary.quickStats.overallCpuUsage
	activeMB int32   // summary.quickStats.guestMemoryUsage
	vcpuMhz  []int64 // cpu.usagemhz.average of each vCPU (instances "0", "1", ...)
	readyMs  int64   // cpu.ready.summation of all vCPUs together (instance "")
}

// The standalone host's VMs (its CPUs run at 2294 MHz): DC0_H0_VM0 has Tools and one busy vCPU
// of four, DC0_H0_VM1 has no Tools (its guestMemoryUsage is an estimate the backend ignores).
var guests = map[string]guestFigures{
	"DC0_H0_VM0": {numCPU: 4, memoryMB: 8192, tools: true, usageMhz: 2294, activeMB: 2048,
		vcpuMhz: []int64{1835, 229, 115, 115}, readyMs: 400},
	"DC0_H0_VM1": {numCPU: 1, memoryMB: 32, usageMhz: 1147, activeMB: 24, vcpuMhz: []int64{1147}, readyMs: 200},
}

// The sample interval of real-time statistics, s.
const realtimeInterval = 20

// perfManager is the simulator's performance manager with real-time samples of the VMs in
// `guests` answered from their figures.
type perfManager struct {
	simulator.PerformanceManager
}

func (p *perfManager) counterName(key int32) string {
	for _, info := range p.PerfCounter {
		if info.Key == key {
			return info.GroupInfo.GetElementDescription().Key + "." + info.NameInfo.GetElementDescription().Key +
				"." + string(info.RollupType)
		}
	}
	return ""
}

// sample is the value of one counter instance of a VM of `guests`, and whether it has one.
func (p *perfManager) sample(figures guestFigures, id types.PerfMetricId) (int64, bool) {
	switch p.counterName(id.CounterId) {
	case "cpu.usagemhz.average":
		if id.Instance == "" {
			var sum int64
			for _, mhz := range figures.vcpuMhz {
				sum += mhz
			}
			return sum, true
		}
		for i, mhz := range figures.vcpuMhz {
			if id.Instance == fmt.Sprint(i) {
				return mhz, true
			}
		}
	case "cpu.ready.summation":
		if id.Instance == "" {
			return figures.readyMs, true
		}
	}
	return 0, false
}

func (p *perfManager) QueryPerf(ctx *simulator.Context, req *types.QueryPerf) soap.HasFault {
	for _, spec := range req.QuerySpec {
		if spec.Entity.Type != "VirtualMachine" {
			return p.PerformanceManager.QueryPerf(ctx, req)
		}
		vm, ok := simulator.Map.Get(spec.Entity).(*simulator.VirtualMachine)
		if !ok {
			return p.PerformanceManager.QueryPerf(ctx, req)
		}
		if _, known := guests[vm.Name]; !known {
			return p.PerformanceManager.QueryPerf(ctx, req)
		}
	}
	body := new(methods.QueryPerfBody)
	body.Res = new(types.QueryPerfResponse)
	now := time.Now().Truncate(realtimeInterval * time.Second)
	for _, spec := range req.QuerySpec {
		vm := simulator.Map.Get(spec.Entity).(*simulator.VirtualMachine)
		figures := guests[vm.Name]
		metrics := &types.PerfEntityMetric{PerfEntityMetricBase: types.PerfEntityMetricBase{Entity: spec.Entity}}
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			metrics.SampleInfo = []types.PerfSampleInfo{{Timestamp: now, Interval: realtimeInterval}}
			for _, id := range spec.MetricId {
				if value, ok := p.sample(figures, id); ok {
					metrics.Value = append(metrics.Value, &types.PerfMetricIntSeries{
						PerfMetricSeries: types.PerfMetricSeries{Id: id}, Value: []int64{value}})
				}
			}
		}
		body.Res.Returnval = append(body.Res.Returnval, metrics)
	}
	return body
}

// The key of the PCI controller every simulated VM has.
const pciControllerKey = 100

func graphicsInfo() []types.HostGraphicsInfo {
	infos := make([]types.HostGraphicsInfo, len(gpuBusIDs))
	for i, bus := range gpuBusIDs {
		infos[i] = types.HostGraphicsInfo{
			DeviceName:     "TU104GL [Tesla T4]",
			VendorName:     "NVIDIA Corporation",
			PciId:          bus,
			GraphicsType:   "sharedDirect",
			MemorySizeInKB: 16 * 1024 * 1024,
		}
	}
	return infos
}

func setUp() (stubbornRef string) {
	hosts := map[string]*simulator.HostSystem{}
	for _, entity := range simulator.Map.All("HostSystem") {
		host := entity.(*simulator.HostSystem)
		host.Config.SharedPassthruGpuTypes = append([]string(nil), gpuTypes...)
		host.Config.GraphicsInfo = graphicsInfo()
		hosts[host.Self.Value] = host
	}
	vms := simulator.Map.All("VirtualMachine")
	sort.Slice(vms, func(i, j int) bool { return vms[i].Entity().Name < vms[j].Entity().Name })
	for _, entity := range vms {
		vm := entity.(*simulator.VirtualMachine)
		if vm.Name == stubbornVM {
			stubbornRef = vm.Self.Value
		}
		if figures, ok := guests[vm.Name]; ok {
			vm.Config.Hardware.NumCPU = figures.numCPU
			vm.Config.Hardware.MemoryMB = figures.memoryMB
			vm.Summary.Config.NumCpu = figures.numCPU
			vm.Summary.Config.MemorySizeMB = figures.memoryMB
			vm.Summary.QuickStats.OverallCpuUsage = figures.usageMhz
			vm.Summary.QuickStats.GuestMemoryUsage = figures.activeMB
			if figures.tools {
				vm.Guest.ToolsStatus = types.VirtualMachineToolsStatusToolsOk
				vm.Guest.ToolsRunningStatus = string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)
				vm.Guest.ToolsVersion = "12352"
				vm.Summary.Guest.ToolsStatus = vm.Guest.ToolsStatus
				vm.Summary.Guest.ToolsRunningStatus = vm.Guest.ToolsRunningStatus
			}
		}
		want, ok := vgpus[vm.Name]
		if !ok {
			continue
		}
		device := &types.VirtualPCIPassthrough{VirtualDevice: types.VirtualDevice{
			Key:           13000,
			ControllerKey: pciControllerKey,
			DeviceInfo:    &types.Description{Label: "PCI device 0", Summary: "NVIDIA GRID vGPU " + want.vgpu},
			Backing:       &types.VirtualPCIPassthroughVmiopBackingInfo{Vgpu: want.vgpu},
		}}
		vm.Config.Hardware.Device = append(vm.Config.Hardware.Device, device)
		if vm.Runtime.Host != nil && vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			if host := hosts[vm.Runtime.Host.Value]; host != nil {
				info := &host.Config.GraphicsInfo[want.gpu]
				info.Vm = append(info.Vm, vm.Self)
			}
		}
	}
	return stubbornRef
}

var privID = regexp.MustCompile(`<privId>([^<]*)</privId>`)

func soapResponse(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?>`+
		`<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/">`+
		`<soapenv:Body>`+body+`</soapenv:Body></soapenv:Envelope>`)
}

var thisRef = regexp.MustCompile(`<_this\b[^>]*\btype="([^"]+)"[^>]*>([^<]+)</_this>`)

// hangingCall is the name of the method in `hang` that the SOAP request `text` calls, with the
// object it is called on, if that object exists; "" otherwise.
func hangingCall(text string, hang map[string]*regexp.Regexp) (string, types.ManagedObjectReference) {
	for method, call := range hang {
		if !call.MatchString(text) {
			continue
		}
		match := thisRef.FindStringSubmatch(text)
		if match == nil {
			continue
		}
		ref := types.ManagedObjectReference{Type: match[1], Value: match[2]}
		if simulator.Map.Get(ref) == nil {
			continue // the simulator answers ManagedObjectNotFound
		}
		return method, ref
	}
	return "", types.ManagedObjectReference{}
}

// hangingTask puts a Task for `method` on `ref` in the inventory, running and never run: its
// info.state stays "running" and the object is left as it was.
func hangingTask(method string, ref types.ManagedObjectReference) *simulator.Task {
	name := strings.TrimSuffix(method, "_Task") + "Task" // CreateTask's own spelling of "X_Task"
	task := simulator.CreateTask(ref, name, func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
		return nil, nil
	})
	simulator.Map.Update(task, []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	return task
}

// faults answers some requests itself, as vSphere would, without passing them on: ShutdownGuest
// of the VM `stubbornRef` (the guest is asked and never powers off), HasPrivilegeOnEntity, where
// the privileges in `denied` are not granted, and the task methods in `hang`, whose tasks never
// finish.
func faults(next http.Handler, stubbornRef string, denied map[string]bool, hang map[string]*regexp.Regexp) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := ioutil.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = ioutil.NopCloser(bytes.NewReader(body))
			text := string(body)
			if stubbornRef != "" && strings.Contains(text, "<ShutdownGuest") && strings.Contains(text, ">"+stubbornRef+"<") {
				soapResponse(w, `<ShutdownGuestResponse xmlns="urn:vim25"></ShutdownGuestResponse>`)
				return
			}
			if len(denied) > 0 && strings.Contains(text, "<HasPrivilegeOnEntity") {
				var answer strings.Builder
				for _, match := range privID.FindAllStringSubmatch(text, -1) {
					fmt.Fprintf(&answer, "<returnval>%t</returnval>", !denied[match[1]])
				}
				soapResponse(w, `<HasPrivilegeOnEntityResponse xmlns="urn:vim25">`+answer.String()+
					`</HasPrivilegeOnEntityResponse>`)
				return
			}
			if method, ref := hangingCall(text, hang); method != "" {
				task := hangingTask(method, ref)
				soapResponse(w, fmt.Sprintf(`<%sResponse xmlns="urn:vim25"><returnval type="Task">%s</returnval>`+
					`</%sResponse>`, method, task.Self.Value, method))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// certificate is a fresh self-signed certificate for 127.0.0.1 (ECDSA P-256: the test server's
// built-in one has a key too short for a client at OpenSSL's default security level).
func certificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	template := x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "vcsim", Organization: []string{"vCenter simulator"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, &template, &template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (port 0: a free one)")
	useTLS := flag.Bool("tls", true, "serve https")
	caFile := flag.String("cafile", "", "write the server's certificate (PEM) to this file")
	username := flag.String("username", "user", "the only user name accepted")
	password := flag.String("password", "pass", "the only password accepted")
	deny := flag.String("deny", "", "privileges refused to the user, comma-separated")
	hang := flag.String("hang", "", "task methods whose tasks never finish (ReconfigVM_Task, ...), comma-separated")
	flag.Parse()
	denied := map[string]bool{}
	for _, name := range strings.Split(*deny, ",") {
		if name != "" {
			denied[name] = true
		}
	}
	hanging := map[string]*regexp.Regexp{}
	for _, name := range strings.Split(*hang, ",") {
		if name != "" {
			// The method's element in the SOAP body, with or without a namespace prefix.
			hanging[name] = regexp.MustCompile(`<(?:[\w.-]+:)?` + regexp.QuoteMeta(name) + `[\s/>]`)
		}
	}

	model := simulator.VPX()
	model.Machine = 3
	if err := model.Create(); err != nil {
		log.Fatal(err)
	}
	ref := setUp()
	perfRef := types.ManagedObjectReference{Type: "PerformanceManager", Value: "PerfMgr"}
	if original, ok := simulator.Map.Get(perfRef).(*simulator.PerformanceManager); ok {
		simulator.Map.Put(&perfManager{PerformanceManager: *original})
	}

	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(*username, *password)}
	model.Service.ServeMux = http.NewServeMux()
	if *useTLS {
		cert, err := certificate()
		if err != nil {
			log.Fatal(err)
		}
		model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	server := model.Service.NewServer()
	server.Config.Handler = faults(server.Config.Handler, ref, denied, hanging)

	if *useTLS && *caFile != "" {
		cert := server.Certificate()
		data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
		if err := ioutil.WriteFile(*caFile, data, 0o644); err != nil {
			log.Fatal(err)
		}
	}
	shown := *server.URL
	shown.User = nil
	fmt.Printf("VCSIM_URL=%s\n", shown.String())
	os.Stdout.Sync()

	done := make(chan os.Signal, 1)
	signal.Notify(done, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		_, _ = io.Copy(ioutil.Discard, os.Stdin)
		done <- syscall.SIGTERM
	}()
	<-done
	server.Close()
	model.Remove()
}
