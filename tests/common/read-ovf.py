"""Reads an OVF descriptor with Python's XML parser (independent of
imager's writer) and prints, separated by |: the file reference's href and
size, the disk's capacity, its allocation units and format (the part after
#), the disk item's host resource, its controller's and the NIC's resource
subtypes, the virtual hardware version, the firmware (VMware's Config
key), and the virtual system's name. Used by imager's unit tests of the OVA
and by tests/platforms.rs."""
import sys
import xml.etree.ElementTree as ET

ns = {
    "ovf": "http://schemas.dmtf.org/ovf/envelope/1",
    "vssd": "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData",
    "rasd": "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData",
    "vmw": "http://www.vmware.com/schema/ovf",
}
O = "{%s}" % ns["ovf"]
V = "{%s}" % ns["vmw"]
root = ET.parse(sys.argv[1]).getroot()
f = root.find("ovf:References/ovf:File", ns)
d = root.find("ovf:DiskSection/ovf:Disk", ns)
vs = root.find("ovf:VirtualSystem", ns)
hw = vs.find("ovf:VirtualHardwareSection", ns)
cfg = {c.get(V + "key"): c.get(V + "value") for c in hw.findall("vmw:Config", ns)}
items = {i.findtext("rasd:InstanceID", "", ns): i for i in hw.findall("ovf:Item", ns)}
kind = lambda t: [i for i in items.values() if i.findtext("rasd:ResourceType", "", ns) == t]
disk = kind("17")[0]
ctl = items[disk.findtext("rasd:Parent", "", ns)]
nic = kind("10")[0]
assert d.get(O + "fileRef") == f.get(O + "id"), "the disk names another file"
print(
    f.get(O + "href"),
    f.get(O + "size"),
    d.get(O + "capacity"),
    d.get(O + "capacityAllocationUnits"),
    d.get(O + "format").rsplit("#", 1)[1],
    disk.findtext("rasd:HostResource", "", ns),
    ctl.findtext("rasd:ResourceSubType", "", ns),
    nic.findtext("rasd:ResourceSubType", "", ns),
    hw.findtext("ovf:System/vssd:VirtualSystemType", "", ns),
    cfg.get("firmware"),
    vs.findtext("ovf:Name", "", ns),
    sep="|",
)
