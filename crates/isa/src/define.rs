//! The macro that turns the instruction table (`table.rs`, whose top documents
//! the format) into code: the [`Inst`](crate::Inst) enum, its pipes and flags,
//! its encoding and decoding, its assembly forms (parsed by `syntax.rs`, printed
//! by `Display`), its register use and its test generators.
//!
//! The helpers below each produce one piece from one entry; they re-read an
//! entry's field list (`{ name: Type = Kind @ bits, ... }`) with the same pattern.
//! Names a helper binds for another (`kinds`, `o`, `f`) are passed in by its
//! caller, because `macro_rules!` keeps a helper's own local names to itself.

/// The whole instruction set from its table; see `table.rs`.
macro_rules! instruction_set {
    (
        $(#[$meta:meta])*
        enum Inst;
        $(
            $(#[$attr:meta])*
            inst $V:ident $fields:tt = $opc:literal, $pipe:ident $($flag:ident)*, $name:tt;
            $(
                asm $mn:tt ($($op:tt)*)
                $(with $with:tt)?
                $(when $when:tt)?
                $(check $check:tt at $ci:literal $cmsg:literal)?
                $(else $hook:ident)?
                $form:literal;
            )+
            $(uses $uses:tt;)?
        )*
    ) => {
        __inst_enum! { [$(#[$meta])*] [] $( [$(#[$attr])*] $V $fields )* }

        #[allow(unused_variables)]
        impl Inst {
            #[inline]
            pub fn pipe(&self) -> Pipe {
                match self {
                    $( Inst::$V { .. } => Pipe::$pipe, )*
                }
            }

            /// Control-flow instructions: forbidden inside a repeat body.
            #[inline]
            pub fn is_control(&self) -> bool {
                match self {
                    $( Inst::$V { .. } => __has_flag!(control $($flag)*), )*
                }
            }

            /// Instructions only the supervisor context may execute.
            #[inline]
            pub fn is_supervisor_only(&self) -> bool {
                match self {
                    $( Inst::$V { .. } => __has_flag!(supervisor $($flag)*), )*
                }
            }

            /// The opcode (bits 30..24 of the instruction's word).
            pub fn opcode(&self) -> u8 {
                match self {
                    $( Inst::$V { .. } => $opc, )*
                }
            }

            /// The variant's name, as written in Rust.
            pub fn variant_name(&self) -> &'static str {
                match self {
                    $( Inst::$V { .. } => stringify!($V), )*
                }
            }

            /// The name error messages give the instruction.
            pub(crate) fn name(&self) -> &'static str {
                match *self {
                    $( __pat!($V $fields) => __name!($name; $( [$mn [$($with)?]] )+), )*
                }
            }

            /// Register reads and writes of a main-pipe instruction: what the
            /// supervisor's issue timing depends on. Aux-pipe instructions report
            /// nothing: only workers execute them, and a worker's barrel slot hides
            /// every dependency.
            #[inline]
            pub fn reg_use(&self) -> RegUse {
                match *self {
                    $( __pat!($V $fields) => {
                        __kinds!(kinds; $fields);
                        __uses!(kinds; $($uses)?)
                    } )*
                }
            }

            /// Checks every field and returns the instruction's word (bit 31 clear).
            pub(crate) fn encode_fields(&self, c: &Check) -> Result<u32, EncodeError> {
                match *self {
                    $( __pat!($V $fields) => __encode!(c; $opc; $fields), )*
                }
            }

            /// The instruction a word holds, and the operand bits it uses; codes
            /// that mean nothing are reserved bits. Fields are not checked.
            pub(crate) fn decode_fields(w: u32) -> Result<(Inst, u32), DecodeError> {
                match Bits::span(30, 24).get(w) as u8 {
                    $( $opc => __decode!(w; $V; $fields), )*
                    opcode => Err(DecodeError::UnknownOpcode { opcode, word: w }),
                }
            }
        }

        impl fmt::Display for Inst {
            #[allow(unused_variables)]
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match *self {
                    $( __pat!($V $fields) => {
                        __kinds!(kinds; $fields);
                        __display!(f kinds; $( [$mn ($($op)*) [$($with)?]] )+)
                    } )*
                }
            }
        }

        /// Every assembly form, in table order.
        pub(crate) static FORMS: &[Form] = &[
            $( $(
                __form!(
                    $V $fields;
                    $mn ($($op)*);
                    [$($with)?] [$($when)?] [$($check $ci $cmsg)?] [$($hook)?];
                    $form
                ),
            )+ )*
        ];

        /// Every instruction: its variant, opcode, pipe and fields' bits.
        #[cfg(test)]
        pub(crate) static ENTRIES: &[Entry] = &[
            $( Entry {
                variant: stringify!($V),
                opcode: $opc,
                pipe: Pipe::$pipe,
                fields: __field_bits!($fields),
            }, )*
        ];

        /// A generator of valid instructions for every variant, from random bits.
        #[cfg(any(test, feature = "testgen"))]
        pub(crate) static GENERATORS: &[(&str, fn([u32; 8]) -> Inst)] = &[
            $( (stringify!($V), __generate!($V $fields)), )*
        ];
    };
}

/// The enum, one variant at a time: an entry without fields is a unit variant.
macro_rules! __inst_enum {
    ([$($meta:tt)*] [$($done:tt)*]) => {
        $($meta)*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Inst {
            $($done)*
        }
    };
    ([$($meta:tt)*] [$($done:tt)*] [$($attr:tt)*] $V:ident {} $($rest:tt)*) => {
        __inst_enum! { [$($meta)*] [$($done)* $($attr)* $V,] $($rest)* }
    };
    (
        [$($meta:tt)*] [$($done:tt)*] [$($attr:tt)*] $V:ident {
            $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
        }
        $($rest:tt)*
    ) => {
        __inst_enum! { [$($meta)*] [$($done)* $($attr)* $V { $($f: $ty),* },] $($rest)* }
    };
}

/// Whether the flag list (after the flag asked for) names it.
macro_rules! __has_flag {
    ($want:ident) => {
        false
    };
    (control control $($rest:ident)*) => {
        true
    };
    (supervisor supervisor $($rest:ident)*) => {
        true
    };
    ($want:ident control $($rest:ident)*) => {
        __has_flag!($want $($rest)*)
    };
    ($want:ident supervisor $($rest:ident)*) => {
        __has_flag!($want $($rest)*)
    };
}

/// A pattern binding every field of the variant by name.
macro_rules! __pat {
    ($V:ident {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {
        Inst::$V { $($f),* }
    };
}

/// A field's bit position: `R0`..`R5`, `[hi:lo]`, `[bit]`, or none (derived).
macro_rules! __bits {
    () => {
        Bits::NONE
    };
    (R0) => {
        Bits::reg(0)
    };
    (R1) => {
        Bits::reg(1)
    };
    (R2) => {
        Bits::reg(2)
    };
    (R3) => {
        Bits::reg(3)
    };
    (R4) => {
        Bits::reg(4)
    };
    (R5) => {
        Bits::reg(5)
    };
    ([$hi:literal : $lo:literal]) => {
        Bits::span($hi, $lo)
    };
    ([$bit:literal]) => {
        Bits::span($bit, $bit)
    };
}

/// Binds `$k` to a struct with a `Field` (kind and bits) per field, so that
/// clauses naming a field can reach its kind. Kinds may read other fields, which
/// must be bound already.
macro_rules! __kinds {
    ($k:ident; {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {
        #[allow(dead_code)]
        struct Kinds {
            $( $f: Field<$K $(<$($g),*>)?>, )*
        }
        let $k = Kinds {
            $( $f: Field {
                kind: $K $(::<$($g),*>)? $(($($dep)*))?,
                bits: __bits!($($pos)?),
            }, )*
        };
    };
}

/// The register bits an entry's `uses` clause names.
macro_rules! __uses {
    ($k:ident;) => {
        RegUse::default()
    };
    ($k:ident; {
        $(reads($($r:ident),*))? $(writes($($w:ident),*))? $(increments($($i:ident),*))?
    }) => {
        RegUse::new(
            0 $($(| $k.$r.regs($r))*)?,
            0 $($(| $k.$w.regs($w))*)?,
            0 $($(| $k.$i.regs($i))*)?,
        )
    };
}

/// The word: opcode, then every field checked and placed, in declaration order
/// (which is the order errors are reported in).
macro_rules! __encode {
    ($c:ident; $opc:literal; {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {{
        let word = u32::from($opc as u8) << 24;
        $(
            let word = word
                | Field {
                    kind: $K $(::<$($g),*>)? $(($($dep)*))?,
                    bits: __bits!($($pos)?),
                }
                .encode($c, stringify!($f), $f)?;
        )*
        Ok(word)
    }};
}

/// The instruction a word holds: every field from its bits, then the fields with
/// no bits from the others.
macro_rules! __decode {
    ($w:ident; $V:ident; {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {{
        $(
            let Some($f) = <$K $(<$($g),*>)? as Kind<$ty>>::decode(__bits!($($pos)?).get($w)) else {
                return Err(DecodeError::ReservedBits { word: $w });
            };
        )*
        $( let $f: $ty = ($K $(::<$($g),*>)? $(($($dep)*))?).derive($f); )*
        let used = 0 $(| __bits!($($pos)?).mask())*;
        Ok((Inst::$V { $($f),* }, used))
    }};
}

/// Every field's bits, for the table's tests.
macro_rules! __field_bits {
    ({
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {
        &[ $( (stringify!($f), __bits!($($pos)?)) ),* ]
    };
}

/// A generator: every field picked from random bits, then repaired against the
/// others.
macro_rules! __generate {
    ($V:ident {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {{
        #[allow(unused_variables, unused_mut)]
        fn generate(seeds: [u32; 8]) -> Inst {
            let mut seeds = seeds.into_iter();
            $(
                let $f: $ty = <$K $(<$($g),*>)? as Kind<$ty>>::pick(
                    seeds.next().unwrap_or(0),
                    __bits!($($pos)?),
                );
            )*
            $( let $f: $ty = ($K $(::<$($g),*>)? $(($($dep)*))?).repair($f); )*
            Inst::$V { $($f),* }
        }
        generate
    }};
}

/// The name: a literal, or `mnemonic` for the mnemonic of the form that prints
/// the instruction.
macro_rules! __name {
    ($name:literal; $($forms:tt)+) => {
        $name
    };
    (mnemonic; [$mn:literal [$($with:tt)?]]) => {
        $mn
    };
    (mnemonic; [$mn:literal [$($with:tt)?]] $($rest:tt)+) => {
        if __with_holds!($($with)?) { $mn } else { __name!(mnemonic; $($rest)+) }
    };
}

/// Whether the fields hold a form's fixed values (`with { field: value, ... }`).
macro_rules! __with_holds {
    () => {
        true
    };
    ({ $($f:ident : $v:expr),* $(,)? }) => {
        true $(&& $f == $v)*
    };
}

/// Prints the instruction with the first form whose fixed values it holds; the
/// last form prints whatever the others do not.
macro_rules! __display {
    ($f:ident $k:ident; [$mn:tt ($($op:tt)*) [$($with:tt)?]]) => {{
        __show_mnemonic!($f; $mn);
        __split_ops!(__show_ops!($f $k [first]) [] [] $($op)*);
        Ok(())
    }};
    ($f:ident $k:ident; [$mn:tt ($($op:tt)*) [$($with:tt)?]] $($rest:tt)+) => {{
        if __with_holds!($($with)?) {
            __show_mnemonic!($f; $mn);
            __split_ops!(__show_ops!($f $k [first]) [] [] $($op)*);
            return Ok(());
        }
        __display!($f $k; $($rest)+)
    }};
}

macro_rules! __show_mnemonic {
    ($f:ident; $mn:literal) => {
        $f.write_str($mn)?
    };
    ($f:ident; ($($part:tt)*)) => {
        $( __show_part!($f; $part); )*
    };
}

macro_rules! __show_part {
    ($f:ident; $text:literal) => {
        $f.write_str($text)?
    };
    ($f:ident; $field:ident) => {
        $f.write_str(SubOp::name($field))?
    };
}

/// Calls `$cb!(args... [operand] [operand]...)` with the comma-separated
/// operands of a form, each in brackets.
macro_rules! __split_ops {
    ($cb:ident!($($args:tt)*) [$($done:tt)*] [$($cur:tt)*] , $($rest:tt)*) => {
        __split_ops!($cb!($($args)*) [$($done)* [$($cur)*]] [] $($rest)*)
    };
    ($cb:ident!($($args:tt)*) [$($done:tt)*] [$($cur:tt)*] $t:tt $($rest:tt)*) => {
        __split_ops!($cb!($($args)*) [$($done)*] [$($cur)* $t] $($rest)*)
    };
    ($cb:ident!($($args:tt)*) [$($done:tt)*] []) => {
        $cb!($($args)* $($done)*)
    };
    ($cb:ident!($($args:tt)*) [$($done:tt)*] [$($cur:tt)+]) => {
        $cb!($($args)* $($done)* [$($cur)+])
    };
}

/// Prints the operands: the first after a space, the others after a comma.
macro_rules! __show_ops {
    ($f:ident $k:ident [$($sep:tt)*]) => {};
    ($f:ident $k:ident [$($sep:tt)*] [$($op:tt)*] $($rest:tt)*) => {
        __show_sep!($f; $($sep)*);
        __show_op!($f $k; $($op)*);
        __show_ops!($f $k [] $($rest)*);
    };
}

macro_rules! __show_sep {
    ($f:ident; first) => {
        $f.write_str(" ")?
    };
    ($f:ident;) => {
        $f.write_str(", ")?
    };
}

macro_rules! __show_op {
    ($f:ident $k:ident; $p:ident += $s:ident) => {
        write!($f, "{}+={}", crate::syntax::M($p), crate::syntax::M($s))?
    };
    ($f:ident $k:ident; $p:ident +=) => {
        write!($f, "{}+=", crate::syntax::M($p))?
    };
    ($f:ident $k:ident; $word:literal) => {
        $f.write_str($word)?
    };
    ($f:ident $k:ident; $x:ident hex $($what:tt)?) => {
        write!($f, "{:#x}", $x)?
    };
    ($f:ident $k:ident; $x:ident $($modifier:tt)*) => {
        $k.$x.show($x, $f)?
    };
}

/// One assembly form as a [`Form`](crate::syntax::Form).
macro_rules! __form {
    (
        $V:ident $fields:tt;
        $mn:tt ($($op:tt)*);
        [$($with:tt)?] [$($when:tt)?] [$($check:tt $ci:literal $cmsg:literal)?] [$($hook:ident)?];
        $form:literal
    ) => {
        Form {
            variant: stringify!($V),
            spells: {
                #[allow(unused_mut, unused_variables)]
                fn spells(mn: &str) -> bool {
                    __blank_fields!($fields);
                    __mnemonic_split!(mn; $mn).is_some()
                }
                spells
            },
            guard: __guard!($($when)?),
            keywords: __split_ops!(__keywords!([] []) [] [] $($op)*),
            count: __split_ops!(__op_count!() [] [] $($op)*),
            optional: __split_ops!(__op_optional!() [] [] $($op)*),
            form: $form,
            otherwise: __otherwise!($($hook)?),
            parse: {
                #[allow(unused_mut, unused_variables, unused_assignments)]
                fn parse(mn: &str, o: &Ops) -> Result<Inst, SyntaxError> {
                    __blank_fields!($fields);
                    __mnemonic_bind!(mn; $mn);
                    __with_assign!($($with)?);
                    __kinds!(kinds; $fields);
                    o.count(
                        __split_ops!(__op_count!() [] [] $($op)*),
                        __split_ops!(__op_optional!() [] [] $($op)*),
                        $form,
                    )?;
                    __split_ops!(__parse_ops!(o kinds [] [] []) [] [] $($op)*);
                    __check!(o; $($check $ci $cmsg)?);
                    Ok(__construct!($V $fields))
                }
                parse
            },
        }
    };
}

/// Every field as a mutable local, to be filled in by parsing.
macro_rules! __blank_fields {
    ({
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {
        $( let mut $f: $ty = <$ty as Blank>::BLANK; )*
    };
}

macro_rules! __construct {
    ($V:ident {
        $( $f:ident : $ty:ident = $K:ident $(<$($g:literal),*>)? $(($($dep:tt)*))? $(@ $pos:tt)? ),* $(,)?
    }) => {
        Inst::$V { $($f),* }
    };
}

/// How `mn` splits into the mnemonic's parts: for each part, the index of the
/// spelling it matches.
macro_rules! __mnemonic_split {
    ($mn:ident; $text:literal) => {
        ($mn == $text).then_some([0; 3])
    };
    ($mn:ident; ($($part:tt)*)) => {{
        let parts: &[&[&str]] = &[$( __part_spellings!($part) ),*];
        split_mnemonic($mn, parts)
    }};
}

macro_rules! __part_spellings {
    ($text:literal) => {
        &[$text]
    };
    ($field:ident) => {
        names_like(&$field)
    };
}

/// Sets the fields named in the mnemonic from `mn`.
macro_rules! __mnemonic_bind {
    ($mn:ident; $text:literal) => {};
    ($mn:ident; ($($part:tt)*)) => {
        let spellings = __mnemonic_split!($mn; ($($part)*)).unwrap_or_default();
        __bind_parts!(spellings [] $($part)*);
    };
}

macro_rules! __bind_parts {
    ($s:ident [$($n:tt)*]) => {};
    ($s:ident [$($n:tt)*] $text:literal $($rest:tt)*) => {
        __bind_parts!($s [$($n)* + 1] $($rest)*);
    };
    ($s:ident [$($n:tt)*] $field:ident $($rest:tt)*) => {
        $field = sub_op_like(&$field, $s[0 $($n)*]);
        __bind_parts!($s [$($n)* + 1] $($rest)*);
    };
}

macro_rules! __with_assign {
    () => {};
    ({ $($f:ident : $v:expr),* $(,)? }) => {
        $( $f = $v; )*
    };
}

macro_rules! __guard {
    () => {
        None
    };
    ([$($shape:tt),* $(,)?]) => {
        Some(&[$( __shape!($shape) ),*])
    };
}

macro_rules! __shape {
    (_) => {
        Shape::Any
    };
    (..) => {
        Shape::Rest
    };
    ($shape:ident) => {
        Shape::$shape
    };
}

macro_rules! __otherwise {
    () => {
        None
    };
    ($hook:ident) => {
        Some(crate::syntax::$hook)
    };
}

/// The keyword operands (`sync local`) and their positions.
macro_rules! __keywords {
    ([$($n:tt)*] [$($done:tt)*]) => {
        &[$($done)*]
    };
    ([$($n:tt)*] [$($done:tt)*] [$word:literal] $($rest:tt)*) => {
        __keywords!([$($n)* + 1] [$($done)* (0 $($n)*, $word),] $($rest)*)
    };
    ([$($n:tt)*] [$($done:tt)*] [$($op:tt)*] $($rest:tt)*) => {
        __keywords!([$($n)* + 1] [$($done)*] $($rest)*)
    };
}

macro_rules! __op_count {
    ($([$($op:tt)*])*) => {
        0 $(+ { let _ = stringify!($($op)*); 1 })*
    };
}

/// Whether the last operand may be left out (`imm?`).
macro_rules! __op_optional {
    () => {
        false
    };
    ([$x:ident ? $($what:tt)?] $($rest:tt)*) => {
        true
    };
    ([$($op:tt)*] $($rest:tt)*) => {
        __op_optional!($($rest)*)
    };
}

/// Parses the operands in order, those marked `late` after the others.
macro_rules! __parse_ops {
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*]) => {
        $($early)*
        $($late)*
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$p:ident += $s:ident] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)* ($p, $s) = $o.ptr_stride(0 $($n)*)?;] [$($late)*] $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$p:ident +=] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)* $p = $o.minc(0 $($n)*)?;] [$($late)*] $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$word:literal] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1] [$($early)*] [$($late)*] $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$x:ident late $($what:tt)?] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)*]
            [$($late)* $x = $k.$x.parse($o, 0 $($n)*, __what!($($what)?))?;]
            $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$x:ident ? $($what:tt)?] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)* if $o.len() > (0 $($n)*) { $x = $k.$x.parse($o, 0 $($n)*, __what!($($what)?))?; }]
            [$($late)*]
            $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$x:ident hex $($what:tt)?] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)* $x = $k.$x.parse($o, 0 $($n)*, __what!($($what)?))?;]
            [$($late)*]
            $($rest)*)
    };
    ($o:ident $k:ident [$($n:tt)*] [$($early:tt)*] [$($late:tt)*] [$x:ident $($what:tt)?] $($rest:tt)*) => {
        __parse_ops!($o $k [$($n)* + 1]
            [$($early)* $x = $k.$x.parse($o, 0 $($n)*, __what!($($what)?))?;]
            [$($late)*]
            $($rest)*)
    };
}

macro_rules! __what {
    () => {
        ""
    };
    ($what:tt) => {
        $what
    };
}

/// A form's own check after its operands (`check { condition } at operand "message"`).
macro_rules! __check {
    ($o:ident;) => {};
    ($o:ident; $cond:tt $ci:literal $cmsg:literal) => {
        if !$cond {
            return err($o.col($ci), $cmsg);
        }
    };
}
