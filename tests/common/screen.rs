//! Reading the text on a machine's screen from a picture of it (`imager
//! boot --screen`, QEMU's `screendump`: a binary PPM), with the font the
//! text is drawn in, taken from where the guest takes it: each cell of the
//! picture whose lit pixels are exactly a printable glyph of that font
//! reads as its character. Nothing of the product decides what a glyph
//! looks like.
//!
//! - [`Font::Kernel`]: the kernel's 8×16 font (`lib/fonts/font_8x16.c` in
//!   its source), which the framebuffer console draws with (UEFI: efifb).
//! - [`Font::VgaBios`]: the 8×16 font of SeaBIOS's VGA BIOS
//!   (`vgabios-stdvga.bin`, QEMU's standard VGA's option ROM), which VGA
//!   text mode shows (BIOS: the kernel's VGA console) in cells 9 pixels
//!   wide.

use super::{ok, tool};
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

/// The kernel source the images are built from (profiles/metal.yaml).
const KERNEL_SOURCE: &str = "/usr/src/linux-source-6.12.tar.xz";
/// The option ROM of QEMU's standard VGA (Debian's seabios package).
const VGA_BIOS: &str = "/usr/share/seabios/vgabios-stdvga.bin";

/// Which font a screen's text is drawn in.
#[derive(Clone, Copy, Debug)]
pub enum Font {
    /// The kernel's, by the framebuffer console: cells of 8 × 16 pixels.
    Kernel,
    /// The VGA BIOS's, in VGA text mode: cells of 9 × 16 pixels.
    VgaBios,
}

type Glyphs = HashMap<[u8; 16], char>;

/// The printable ASCII glyphs of `table` (256 glyphs of 16 rows).
fn printable(table: &[u8]) -> Glyphs {
    assert_eq!(table.len(), 256 * 16, "not 256 glyphs of 16 rows");
    (0x20u8..0x7f)
        .map(|c| {
            let at = usize::from(c) * 16;
            let rows: [u8; 16] = table[at..at + 16].try_into().unwrap();
            (rows, char::from(c))
        })
        .collect()
}

/// The VGA BIOS's 8×16 font: the one place in its ROM where a table of
/// 256 glyphs of 16 rows has glyph 0 and the space blank and glyph 0xDB
/// (the full block of code page 437) all set.
fn vga_bios_glyphs() -> &'static Glyphs {
    static G: OnceLock<Glyphs> = OnceLock::new();
    G.get_or_init(|| {
        let rom = std::fs::read(VGA_BIOS).unwrap();
        let found: Vec<usize> = (0..rom.len().saturating_sub(4096))
            .filter(|&o| {
                rom[o..o + 16] == [0; 16]
                    && rom[o + 0x20 * 16..o + 0x21 * 16] == [0; 16]
                    && rom[o + 0xdb * 16..o + 0xdc * 16] == [0xff; 16]
            })
            .collect();
        assert_eq!(found.len(), 1, "{VGA_BIOS}: 8x16 font tables at {found:?}");
        printable(&rom[found[0]..found[0] + 4096])
    })
}

/// The printable ASCII glyphs of the kernel's 8×16 font.
fn kernel_glyphs() -> &'static Glyphs {
    static G: OnceLock<Glyphs> = OnceLock::new();
    G.get_or_init(|| {
        let dir = super::scratch().join("font");
        std::fs::create_dir_all(&dir).unwrap();
        ok(tool("tar")
            .arg("-xJf")
            .arg(KERNEL_SOURCE)
            .arg("-C")
            .arg(&dir)
            .args(["--wildcards", "*/lib/fonts/font_8x16.c"]));
        let found = ok(tool("find").arg(&dir).args(["-name", "font_8x16.c"]));
        let text = std::fs::read_to_string(found.lines().next().unwrap().trim()).unwrap();
        printable(&font_bytes(&text))
    })
}

/// The font's bytes: every `0xNN` of the C source outside comments.
fn font_bytes(c_source: &str) -> Vec<u8> {
    let mut code = String::new();
    let mut rest = c_source;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, after)| after);
    }
    code.push_str(rest);
    code.split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|t| t.strip_prefix("0x"))
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect()
}

/// A binary PPM (P6, maxval 255): width, height and RGB pixels.
struct Picture {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

fn read_ppm(path: &Path) -> Picture {
    let data = std::fs::read(path).unwrap();
    let mut fields = Vec::new();
    let mut at = 0;
    while fields.len() < 4 {
        while data[at].is_ascii_whitespace() {
            at += 1;
        }
        let start = at;
        while !data[at].is_ascii_whitespace() {
            at += 1;
        }
        fields.push(String::from_utf8(data[start..at].to_vec()).unwrap());
    }
    assert_eq!((fields[0].as_str(), fields[3].as_str()), ("P6", "255"));
    let (width, height) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
    let rgb = data[at + 1..].to_vec();
    assert_eq!(rgb.len(), width * height * 3, "{}", path.display());
    Picture { width, height, rgb }
}

/// The lines of text on the screen in `ppm`, drawn in `font` from its top
/// left corner (in VGA text mode the ninth column of a cell is blank for
/// letters), trailing blanks removed; a cell that is no glyph of the font
/// reads as `?`.
pub fn text(ppm: &Path, font: Font) -> Vec<String> {
    let (glyphs, cell_width) = match font {
        Font::Kernel => (kernel_glyphs(), 8),
        Font::VgaBios => (vga_bios_glyphs(), 9),
    };
    let p = read_ppm(ppm);
    let lit = |x: usize, y: usize| {
        let i = (y * p.width + x) * 3;
        p.rgb[i..i + 3].iter().any(|&c| c > 0x40)
    };
    (0..p.height / 16)
        .map(|row| {
            let line: String = (0..p.width / cell_width)
                .map(|col| {
                    let mut cell = [0u8; 16];
                    for (y, bits) in cell.iter_mut().enumerate() {
                        for x in 0..8 {
                            if lit(col * cell_width + x, row * 16 + y) {
                                *bits |= 0x80 >> x;
                            }
                        }
                    }
                    glyphs.get(&cell).copied().unwrap_or('?')
                })
                .collect();
            line.trim_end().to_string()
        })
        .collect()
}
