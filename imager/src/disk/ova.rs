//! The output `vmware` (`vmware.ova`): an OVF 1.0 package for VMware
//! vSphere, ESXi, Workstation and Fusion (and VirtualBox), and the reader
//! that finds the disk in one.
//!
//! An OVA is a ustar archive (DMTF DSP0243 1.0, "OVF Packages"): the OVF
//! descriptor first, then the files its `References` name, in that order.
//! Ours holds two members:
//!
//! 1. `vmware.ovf`, the descriptor ([`descriptor`]): one virtual system of
//!    hardware version `vmx-14` (ESXi 6.7 and later), guest type
//!    `otherLinux64Guest` (known to every ESXi), booting under EFI
//!    (`vmw:Config firmware=efi`), 2 CPUs and 2 GiB of memory, the disk on
//!    a SATA (AHCI) controller and a VMXNET3 NIC, and the disk's capacity
//!    and file size;
//! 2. `disk.vmdk`, the disk as a stream-optimised VMDK ([`super::vmdk`]),
//!    the only VMDK variant an OVA may carry.
//!
//! The disk sits on SATA, not on PVSCSI: VMware's EFI firmware boots from
//! both, but the EFI firmware QEMU runs (OVMF) has no PVSCSI driver, so
//! SATA is what the tests can boot as the descriptor says. The kernel has
//! PVSCSI too: a disk moved to one after the import boots.
//!
//! The VMDK is written to a temporary file first: the descriptor names its
//! size and the tar header precedes its bytes. Both members are then
//! streamed into the archive; every header field is fixed (mode 0644,
//! owner 0, the build's epoch), so the same disk gives the same bytes.

use crate::io::AtomicFile;
use anyhow::{Context, Result, bail};
use payload::targuard::TarGuard;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

/// The members of the OVA, in their order.
pub const OVF_NAME: &str = "vmware.ovf";
pub const VMDK_NAME: &str = "disk.vmdk";
/// The hardware version the descriptor asks for.
pub const HARDWARE_VERSION: &str = "vmx-14";
/// The most bytes of descriptor the reader takes.
const MAX_OVF: u64 = 1 << 20;

/// What the descriptor says besides the disk.
#[derive(Debug, Clone, Copy)]
pub struct Machine<'a> {
    /// The virtual machine's name (the profile's).
    pub name: &'a str,
    pub cpus: u32,
    pub memory_mib: u32,
}

/// `s` with XML's five special characters escaped, for text and
/// attribute values.
fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

/// The OVF descriptor of a machine `m` whose disk is `capacity` bytes,
/// held in a VMDK of `vmdk_size` bytes.
pub fn descriptor(m: &Machine, capacity: u64, vmdk_size: u64) -> String {
    let name = xml(m.name);
    let (cpus, mem) = (m.cpus, m.memory_mib);
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:cim="http://schemas.dmtf.org/wbem/wscim/1/common" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1" xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:vmw="http://www.vmware.com/schema/ovf" xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <References>
    <File ovf:href="{VMDK_NAME}" ovf:id="file1" ovf:size="{vmdk_size}"/>
  </References>
  <DiskSection>
    <Info>Virtual disk information</Info>
    <Disk ovf:capacity="{capacity}" ovf:capacityAllocationUnits="byte" ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
  </DiskSection>
  <NetworkSection>
    <Info>The list of logical networks</Info>
    <Network ovf:name="VM Network">
      <Description>The VM Network network</Description>
    </Network>
  </NetworkSection>
  <VirtualSystem ovf:id="{name}">
    <Info>A virtual machine</Info>
    <Name>{name}</Name>
    <OperatingSystemSection ovf:id="101" vmw:osType="otherLinux64Guest">
      <Info>The kind of installed guest operating system</Info>
    </OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements</Info>
      <System>
        <vssd:ElementName>Virtual Hardware Family</vssd:ElementName>
        <vssd:InstanceID>0</vssd:InstanceID>
        <vssd:VirtualSystemIdentifier>{name}</vssd:VirtualSystemIdentifier>
        <vssd:VirtualSystemType>{HARDWARE_VERSION}</vssd:VirtualSystemType>
      </System>
      <Item>
        <rasd:AllocationUnits>hertz * 10^6</rasd:AllocationUnits>
        <rasd:Description>Number of Virtual CPUs</rasd:Description>
        <rasd:ElementName>{cpus} virtual CPU(s)</rasd:ElementName>
        <rasd:InstanceID>1</rasd:InstanceID>
        <rasd:ResourceType>3</rasd:ResourceType>
        <rasd:VirtualQuantity>{cpus}</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits>
        <rasd:Description>Memory Size</rasd:Description>
        <rasd:ElementName>{mem}MB of memory</rasd:ElementName>
        <rasd:InstanceID>2</rasd:InstanceID>
        <rasd:ResourceType>4</rasd:ResourceType>
        <rasd:VirtualQuantity>{mem}</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:Address>0</rasd:Address>
        <rasd:Description>SATA Controller</rasd:Description>
        <rasd:ElementName>SATA controller 0</rasd:ElementName>
        <rasd:InstanceID>3</rasd:InstanceID>
        <rasd:ResourceSubType>vmware.sata.ahci</rasd:ResourceSubType>
        <rasd:ResourceType>20</rasd:ResourceType>
      </Item>
      <Item>
        <rasd:AddressOnParent>0</rasd:AddressOnParent>
        <rasd:ElementName>Hard disk 1</rasd:ElementName>
        <rasd:HostResource>ovf:/disk/vmdisk1</rasd:HostResource>
        <rasd:InstanceID>4</rasd:InstanceID>
        <rasd:Parent>3</rasd:Parent>
        <rasd:ResourceType>17</rasd:ResourceType>
      </Item>
      <Item>
        <rasd:AutomaticAllocation>true</rasd:AutomaticAllocation>
        <rasd:Connection>VM Network</rasd:Connection>
        <rasd:Description>VmxNet3 ethernet adapter on "VM Network"</rasd:Description>
        <rasd:ElementName>Network adapter 1</rasd:ElementName>
        <rasd:InstanceID>5</rasd:InstanceID>
        <rasd:ResourceSubType>VmxNet3</rasd:ResourceSubType>
        <rasd:ResourceType>10</rasd:ResourceType>
      </Item>
      <vmw:Config ovf:required="false" vmw:key="firmware" vmw:value="efi"/>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
"#
    )
}

/// Writes `dest`, the OVA of the raw disk `raw` for the machine `m`: the
/// descriptor, then the stream-optimised VMDK (its ids from the disk GUID
/// `id`), each member's time the build's `epoch`.
pub fn write_ova(raw: &Path, dest: &Path, m: &Machine, id: [u8; 16], epoch: u64) -> Result<()> {
    let capacity = std::fs::metadata(raw)
        .with_context(|| format!("reading {}", raw.display()))?
        .len();
    // The VMDK, beside the destination under a name a later build sweeps.
    let vmdk = AtomicFile::create(dest.with_file_name(format!(
        "{}.vmdk",
        dest.file_name().unwrap_or_default().to_string_lossy()
    )))?;
    let d = super::vmdk::Descriptor {
        id,
        file_name: VMDK_NAME,
        adapter: super::vmdk::ADAPTER,
    };
    super::vmdk::write_vmdk(raw, vmdk.path(), &d)?;
    let vmdk_size = std::fs::metadata(vmdk.path())?.len();
    // A ustar header holds a size below 8 GiB; past it the member would
    // need a GNU or pax extension, which DSP0243 does not allow.
    if vmdk_size >= 1 << 33 {
        bail!(
            "the OVA's VMDK would be {vmdk_size} bytes: an OVA is a ustar archive, whose \
             members are under 8 GiB; use the output aws (aws.vmdk, the same disk) or raw"
        );
    }
    let ovf = descriptor(m, capacity, vmdk_size);

    let mut out = AtomicFile::create(dest)?;
    let werr = || format!("writing {}", dest.display());
    let mut b = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, out.file()));
    let mut h = crate::oci::tar_header(tar::EntryType::Regular, 0o644, ovf.len() as u64, epoch);
    b.append_data(&mut h, OVF_NAME, ovf.as_bytes())
        .with_context(werr)?;
    let mut h = crate::oci::tar_header(tar::EntryType::Regular, 0o644, vmdk_size, epoch);
    let f = File::open(vmdk.path()).with_context(werr)?;
    b.append_data(&mut h, VMDK_NAME, BufReader::with_capacity(1 << 20, f))
        .with_context(werr)?;
    b.into_inner()
        .and_then(|mut w| w.flush())
        .with_context(werr)?;
    drop(vmdk);
    out.commit().with_context(werr)?;
    Ok(())
}

/// Reads the OVA `r` (a tar stream) and writes the disk of its first
/// `.vmdk` member, a stream-optimised VMDK, into `out` (sparse); returns
/// the disk's size. The descriptor must come first; it is not read (the
/// signed manifest, not the descriptor, says what the disk is).
pub fn unpack(r: &mut dyn Read, out: &File) -> Result<u64> {
    let mut ar = tar::Archive::new(TarGuard::new(r));
    let mut entries = ar.entries().map_err(|e| super::tar_error(e, "the OVA"))?;
    let mut first = true;
    for (i, e) in entries.by_ref().enumerate() {
        let mut e = e.map_err(|e| super::tar_error(e, "the OVA"))?;
        if i >= 16 {
            bail!("the OVA has more than 16 members before its disk: not one this reader takes");
        }
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let shown = contract::text::escape(&name);
        if e.header().entry_type() != tar::EntryType::Regular {
            bail!("the OVA's member {shown} is not a regular file");
        }
        if first {
            if !name.ends_with(".ovf") {
                bail!("the OVA's first member is {shown}: an OVA starts with its .ovf descriptor");
            }
            if e.size() > MAX_OVF {
                bail!(
                    "the OVA's descriptor is {} bytes: at most {MAX_OVF} are taken",
                    e.size()
                );
            }
            first = false;
            continue;
        }
        if name.ends_with(".vmdk") {
            let size = super::vmdk::unpack(&mut e, out)
                .with_context(|| format!("reading the OVA's disk {shown}"))?;
            return Ok(size);
        }
    }
    if first {
        bail!("the OVA is empty: no descriptor, no disk");
    }
    bail!("the OVA holds no .vmdk disk")
}

#[cfg(test)]
mod tests;
